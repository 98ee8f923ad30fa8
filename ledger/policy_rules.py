"""Rules and limits of a tool policy: validated when a policy file is loaded, compiled once per
policy-table version (``ledger.policies`` caches them with the tool policies), evaluated on every
record of an action.

A rule reads the call's ``args``::

    {"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approval": "manual"}}

``if`` is a condition: ``{"arg": <dotted path into args>, <operator>: <operand>}`` with one of
``eq ne gt gte lt lte in not_in matches``, or ``{"all": [conditions]}`` / ``{"any": [conditions]}``.
``then`` sets ``risk``, ``approval``, ``approvers`` (how many distinct people must approve) and
``effect`` (``allow``, the default, or ``deny``). The first rule whose condition matches applies.

**Rules fail closed on types.** The agent is hostile: its args may hold anything JSON can say, and
the tool behind the call may read ``"5000"`` as 5000, or ``["gbp"]`` as ``"gbp"``. So a condition
never coerces and never fails; it is *true*, *false* or *undecided*:

- a path segment names an object key (a segment of digits also indexes a list). A path the args do
  not have (an object without the key, a list index past the end) is *missing*; a path that runs
  into a value of another kind on the way (a string, a number, null, a list read by a name) is
  *malformed*, and every condition on it is undecided;
- the kinds are number (finite, not a boolean), string, boolean, null, list and object; NaN and the
  infinities are none of them (they compare with nothing);
- ``eq`` is true when the value is the same JSON value as the operand (``1`` equals ``1.0``; lists
  and objects element by element), false when it is of the operand's kind and differs (a list of
  another length, an object with other keys), undecided when it is of another kind (``true`` for
  ``1``, ``"5"`` for ``5``, ``["gbp"]`` for ``"gbp"``); false for a missing path;
- ``in`` is true when the value ``eq``-equals an element, undecided when no element is of the
  value's kind (or an element of its kind is undecided and none is equal), false otherwise;
- ``ne`` and ``not_in`` are exactly the negations of ``eq`` and ``in``: true for a missing path,
  undecided where those are undecided;
- ``gt gte lt lte`` compare a number with the operand (a number, checked at load); a missing path is
  false; any other value — ``"20000"``, a boolean, null, a list, an object, NaN — is undecided;
- ``matches`` (an ``fnmatch`` glob, case-sensitive, the whole string) is true or false for a string,
  false for a missing path, undecided for anything else;
- ``all`` and ``any`` combine the three answers as Kleene's logic does: ``all`` is false when one
  is false, else undecided when one is undecided; ``any`` is true when one is true, else undecided
  when one is undecided.

The rules are tried in order; the first whose condition is true applies. A rule whose condition is
undecided (before that one) *may* apply: the call gets the strictest of both answers — the rule's
outcome (as if it matched) combined with what the rules after it give (as if it did not), on each
of effect, risk, approval and approvers (``ledger.policies.ResolvedPolicy.with_args``). So a rule
that tightens the policy it would override (deny, a higher risk, manual approval where the policy
says auto, more approvers) applies, one that only relaxes it does not, and one that does both
applies with its tightening parts only: a value's type never buys an unattended call.

A limit counts recent actions::

    {"window": "1h", "per": "agent", "max_count": 20, "on_exceed": "approve"}
    {"window": "24h", "per": "tenant", "sum_arg": "amount", "max_sum": 100000, "on_exceed": "deny"}

(counting is ``ledger.services.limits``; a ``sum_arg`` value that is missing, malformed or not a
finite number exceeds the limit, since it cannot be shown to stay within it — and so does every
call while the window holds such a value that a person let through; a negative one counts as 0).
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ledger.durations import Duration, duration_read
from ledger.models import ApprovalMode, Risk

COMPARISONS = ("gt", "gte", "lt", "lte")
OPERATORS = ("eq", "ne", *COMPARISONS, "in", "not_in", "matches")
COMBINATORS = ("all", "any")
EFFECTS = ("allow", "deny")
PER_VALUES = ("agent", "tenant")
ON_EXCEED_VALUES = ("approve", "deny")

MAX_RULES = 100
MAX_LIMITS = 10
MAX_DEPTH = 6  # nesting of all/any
MAX_BRANCHES = 50  # conditions in one all/any
MAX_LIST = 1000  # elements of an in/not_in list
MAX_PATH_SEGMENTS = 20
MAX_PATH_LENGTH = 200
MAX_APPROVERS = 10
MAX_WINDOW_S = 31 * 24 * 3600
MAX_DESCRIPTION = 200

_SEGMENT = re.compile(r"^[^.\s]{1,100}$")


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


# A path the args do not have; a path that ran into a value of another kind on the way.
MISSING: Any = _Sentinel("MISSING")
MALFORMED: Any = _Sentinel("MALFORMED")

# A condition's answer: True, False, or UNDECIDED (a value of another kind than the comparison
# needs). ``None`` keeps it cheap; the name says what it means.
Truth = bool | None
UNDECIDED: Truth = None


# --- Values: the type rule ---------------------------------------------------------------------


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "number"
    if isinstance(value, float):
        # NaN and the infinities are not numbers a policy can compare with: they get a kind of
        # their own, which no operand the loader accepts shares.
        return "number" if math.isfinite(value) else "non-finite"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return "other"


def is_number(value: Any) -> bool:
    """A finite JSON number: int or float, not a boolean, not NaN nor an infinity."""
    return _kind(value) == "number"


def _all3(answers: Iterable[Truth]) -> Truth:
    """Kleene's and: False when one is False, else UNDECIDED when one is, else True."""
    result: Truth = True
    for answer in answers:
        if answer is False:
            return False
        if answer is UNDECIDED:
            result = UNDECIDED
    return result


def _any3(answers: Iterable[Truth]) -> Truth:
    """Kleene's or: True when one is True, else UNDECIDED when one is, else False."""
    result: Truth = False
    for answer in answers:
        if answer is True:
            return True
        if answer is UNDECIDED:
            result = UNDECIDED
    return result


def _not3(answer: Truth) -> Truth:
    return UNDECIDED if answer is UNDECIDED else not answer


def same_value(value: Any, operand: Any) -> Truth:
    """``eq`` without coercion: True for the same JSON value, False for another value of the
    operand's kind, UNDECIDED for a value of another kind (anywhere inside a list or object too).
    Recursion is bounded by the operand, which comes from the policy file: a kind that differs
    stops the walk."""
    kind = _kind(value)
    if kind != _kind(operand) or kind in ("other", "non-finite"):
        return UNDECIDED
    if kind == "list":
        if len(value) != len(operand):
            return False
        return _all3(same_value(v, o) for v, o in zip(value, operand, strict=True))
    if kind == "object":
        if value.keys() != operand.keys():
            return False
        return _all3(same_value(value[key], operand[key]) for key in operand)
    return bool(value == operand)


def value_at(args: Any, segments: Sequence[str]) -> Any:
    """The value at a dotted path (already split), ``MISSING`` or ``MALFORMED``. Bounded by the
    path's length."""
    value = args
    for segment in segments:
        if isinstance(value, Mapping):
            if segment not in value:
                return MISSING
            value = value[segment]
        elif isinstance(value, list) and segment.isdigit():
            if int(segment) >= len(value):
                return MISSING
            value = value[int(segment)]
        else:
            # A string, number, boolean or null where the path goes on, or a list read by a name:
            # the agent sent another shape than the policy reads, which must not read as absent.
            return MALFORMED
    return value


# --- Compiled forms ------------------------------------------------------------------------------

Test = Callable[[Any], Truth]


def _membership(operand: Sequence[Any]) -> Test:
    """``in`` on a present value: the operand's elements grouped by kind once, at compile time; the
    scalar kinds as sets, so a long list costs one lookup. A kind absent from the list is
    UNDECIDED: the value is of a kind the policy never compares with."""
    scalars: dict[str, set[Any]] = {}
    others: dict[str, list[Any]] = {}
    for element in operand:
        kind = _kind(element)
        if kind in ("number", "string", "boolean", "null"):
            scalars.setdefault(kind, set()).add(element)
        else:
            others.setdefault(kind, []).append(element)

    def test(value: Any) -> Truth:
        kind = _kind(value)
        if kind in scalars:
            # Within one kind, Python's equality is JSON's (1 == 1.0; no bool among numbers).
            return value in scalars[kind]
        if kind in others and kind not in ("other", "non-finite"):
            return _any3(same_value(value, element) for element in others[kind])
        return UNDECIDED

    return test


def _test(op: str, operand: Any) -> Test:
    """The three-valued predicate on a value (possibly ``MISSING``; never ``MALFORMED``, which the
    condition answers UNDECIDED before asking) for one operator."""
    if op in ("eq", "ne", "in", "not_in"):
        member = _membership([operand] if op in ("eq", "ne") else operand)
        if op in ("eq", "in"):
            return lambda v: False if v is MISSING else member(v)
        return lambda v: True if v is MISSING else _not3(member(v))
    if op == "matches":
        pattern = re.compile(fnmatch.translate(operand), re.DOTALL)

        def glob(v: Any) -> Truth:
            if v is MISSING:
                return False
            return pattern.match(v) is not None if isinstance(v, str) else UNDECIDED

        return glob
    compare: dict[str, Callable[[Any, Any], bool]] = {
        "gt": lambda v, o: bool(v > o),
        "gte": lambda v, o: bool(v >= o),
        "lt": lambda v, o: bool(v < o),
        "lte": lambda v, o: bool(v <= o),
    }
    check = compare[op]

    def numeric(v: Any) -> Truth:
        if v is MISSING:
            return False
        return check(v, operand) if is_number(v) else UNDECIDED

    return numeric


@dataclass(frozen=True)
class Condition:
    """A compiled condition: a leaf (``path`` + ``test``) or a combination (``children``)."""

    combinator: str  # "", "all" or "any"
    path: tuple[str, ...] = ()
    test: Test | None = None
    children: tuple[Condition, ...] = ()

    def truth(self, args: Any) -> Truth:
        if self.combinator == "all":
            return _all3(child.truth(args) for child in self.children)
        if self.combinator == "any":
            return _any3(child.truth(args) for child in self.children)
        assert self.test is not None
        value = value_at(args, self.path)
        return UNDECIDED if value is MALFORMED else self.test(value)

    def undecided_paths(self, args: Any) -> list[str]:
        """The paths whose values left a leaf undecided (what a stamp and a refusal name)."""
        if self.combinator:
            found = [path for child in self.children for path in child.undecided_paths(args)]
            return list(dict.fromkeys(found))
        return [".".join(self.path)] if self.truth(args) is UNDECIDED else []


@dataclass(frozen=True)
class Rule:
    index: int
    condition: Condition
    then: dict[str, Any]
    description: str

    @property
    def denies(self) -> bool:
        return self.then.get("effect") == "deny"

    def stamp(self) -> dict[str, Any]:
        """What an action records about a rule that applied to it (``policy.rule``)."""
        return {"index": self.index, "description": self.description, "then": dict(self.then)}


@dataclass(frozen=True)
class Applied:
    """A rule that applied to one call: ``undecided`` names the paths whose values' kinds left its
    condition undecided (empty: its condition was true)."""

    rule: Rule
    undecided: tuple[str, ...] = ()

    @property
    def index(self) -> int:
        return self.rule.index

    def stamp(self) -> dict[str, Any]:
        stamp = self.rule.stamp()
        if self.undecided:
            stamp["undecided"] = list(self.undecided)
        return stamp


@dataclass(frozen=True)
class Decision:
    """Which rules may apply to a call: ``matched`` the first whose condition is true (None: no
    rule's is), ``undecided`` every rule before it whose condition is undecided, in order. Which
    of these apply, and what they make of the policy, is ``ResolvedPolicy.with_args``'s to say:
    it knows the policy they would override."""

    matched: Rule | None = None
    undecided: tuple[Applied, ...] = ()


NO_DECISION = Decision()


@dataclass(frozen=True)
class RulesApplied:
    """The rules that applied to one call, in rule order (at least one). The action records the
    first as ``policy.rule``; further ones (a rule undecided by a value's kind that made the
    outcome stricter, beside the one that matched) under its ``also``."""

    applied: tuple[Applied, ...]

    @property
    def index(self) -> int:
        return self.applied[0].index

    def stamp(self) -> dict[str, Any]:
        stamp = self.applied[0].stamp()
        if len(self.applied) > 1:
            stamp["also"] = [applied.stamp() for applied in self.applied[1:]]
        return stamp


@dataclass(frozen=True)
class Limit:
    index: int
    window: str
    window_s: int
    per: str
    on_exceed: str
    max_count: int | None = None
    sum_arg: tuple[str, ...] = ()
    max_sum: int | float | None = None
    description: str = ""

    def stamp(self) -> dict[str, Any]:
        return {"index": self.index, "description": self.description}


@dataclass(frozen=True)
class CompiledRules:
    """A tool policy's rules and limits, compiled. ``problems``: what a row written past the
    loader (the admin, a shell) got wrong; such a policy refuses every record (fail closed)."""

    rules: tuple[Rule, ...] = ()
    limits: tuple[Limit, ...] = ()
    problems: tuple[str, ...] = field(default=())

    def decide(self, args: Any) -> Decision:
        if not self.rules:
            return NO_DECISION
        undecided: list[Applied] = []
        for rule in self.rules:
            truth = rule.condition.truth(args)
            if truth is True:
                return Decision(matched=rule, undecided=tuple(undecided))
            if truth is UNDECIDED:
                undecided.append(Applied(rule, tuple(rule.condition.undecided_paths(args))))
        return Decision(undecided=tuple(undecided))


NO_RULES = CompiledRules()


def _compile_condition(raw: dict[str, Any]) -> Condition:
    for combinator in COMBINATORS:
        if combinator in raw:
            return Condition(combinator, children=tuple(_compile_condition(c) for c in raw[combinator]))
    op = next(op for op in OPERATORS if op in raw)
    return Condition("", path=tuple(str(raw["arg"]).split(".")), test=_test(op, raw[op]))


def compile_rules(rules: Any, limits: Any) -> CompiledRules:
    """Compile a policy's stored ``rules`` and ``limits`` (validated again first: a stored row
    may not have come through the loader)."""
    if not rules and not limits:
        return NO_RULES
    problems = rules_problems(rules or []) + limits_problems(limits or [])
    if problems:
        return CompiledRules(problems=tuple(problems))
    return CompiledRules(
        rules=tuple(
            Rule(
                index=index,
                condition=_compile_condition(raw["if"]),
                then=dict(raw["then"]),
                description=describe_rule(raw),
            )
            for index, raw in enumerate(rules or [])
        ),
        limits=tuple(_compile_limit(index, raw) for index, raw in enumerate(limits or [])),
    )


def _compile_limit(index: int, raw: dict[str, Any]) -> Limit:
    window = _window(raw["window"])
    assert window is not None
    return Limit(
        index=index,
        window=raw["window"],
        window_s=int(window.seconds),
        per=raw["per"],
        on_exceed=raw.get("on_exceed", "approve"),
        max_count=raw.get("max_count"),
        sum_arg=tuple(raw["sum_arg"].split(".")) if "sum_arg" in raw else (),
        max_sum=raw.get("max_sum"),
        description=describe_limit(raw),
    )


# --- Validation (the loader's, and compile's) -------------------------------------------------


def _window(value: Any) -> Duration | None:
    """A limit's window (``ledger.durations``): a whole number of seconds above 0, written as a
    duration; None for anything else."""
    duration = duration_read(value) if isinstance(value, str) else None
    if duration is None or not isinstance(duration.seconds, int) or duration.seconds < 1:
        return None
    return duration


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _path_problem(value: Any) -> str:
    if not isinstance(value, str) or not value:
        return "expected a dotted path into args (a non-empty string such as customer.country)"
    if len(value) > MAX_PATH_LENGTH:
        return f"a path is at most {MAX_PATH_LENGTH} characters"
    segments = value.split(".")
    if len(segments) > MAX_PATH_SEGMENTS:
        return f"a path has at most {MAX_PATH_SEGMENTS} segments"
    if not all(_SEGMENT.match(s) for s in segments):
        return f"'{value}' is not a dotted path (empty segment or whitespace)"
    return ""


def _condition_problems(raw: Any, where: str, depth: int) -> list[str]:
    if not isinstance(raw, dict):
        return [f'{where}: expected an object such as {{"arg": "amount", "gt": 100}}']
    combinators = [c for c in COMBINATORS if c in raw]
    if combinators:
        if len(raw) != 1:
            return [f"{where}: {combinators[0]} stands alone (no other keys beside it)"]
        name = combinators[0]
        children = raw[name]
        if not isinstance(children, list) or not children:
            return [f"{where}.{name}: expected a non-empty list of conditions"]
        if len(children) > MAX_BRANCHES:
            return [f"{where}.{name}: at most {MAX_BRANCHES} conditions"]
        if depth >= MAX_DEPTH:
            return [f"{where}.{name}: all/any nest at most {MAX_DEPTH} deep"]
        return [
            problem
            for index, child in enumerate(children)
            for problem in _condition_problems(child, f"{where}.{name}[{index}]", depth + 1)
        ]
    problems: list[str] = []
    unknown = sorted(k for k in raw if k != "arg" and k not in OPERATORS)
    for key in unknown:
        problems.append(
            f"{where}.{key}: unknown operator; use one of {', '.join(OPERATORS)} (with arg), or all/any"
        )
    if "arg" not in raw:
        problems.append(f"{where}.arg: required (the dotted path into args the condition reads)")
    elif problem := _path_problem(raw["arg"]):
        problems.append(f"{where}.arg: {problem}")
    ops = [op for op in OPERATORS if op in raw]
    if not ops and not unknown:
        problems.append(f"{where}: needs one operator ({', '.join(OPERATORS)})")
    if len(ops) > 1:
        problems.append(f"{where}: one operator per condition, got {', '.join(ops)} (combine them with all)")
    for op in ops:
        operand = raw[op]
        if op in COMPARISONS and not is_number(operand):
            problems.append(f"{where}.{op}: expected a number, got {_shown(operand)}")
        elif op in ("in", "not_in"):
            if not isinstance(operand, list) or not operand:
                problems.append(f"{where}.{op}: expected a non-empty list, got {_shown(operand)}")
            elif len(operand) > MAX_LIST:
                problems.append(f"{where}.{op}: at most {MAX_LIST} values")
            elif _has_non_finite(operand):
                problems.append(f"{where}.{op}: NaN and infinities compare with nothing; remove them")
        elif op in ("eq", "ne") and _has_non_finite(operand):
            problems.append(f"{where}.{op}: NaN and infinities compare with nothing; remove them")
        elif op == "matches" and (not isinstance(operand, str) or not operand):
            problems.append(
                f"{where}.{op}: expected a glob pattern (a non-empty string), got {_shown(operand)}"
            )
    return problems


def _has_non_finite(value: Any) -> bool:
    """Whether a NaN or an infinity (which Python's JSON reader accepts) is anywhere in an operand:
    such an operand could never be equal to anything, and a rule on it would never be decided."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    return False


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= 60 else text[:57] + "..."


def then_problems(raw: Any, where: str) -> list[str]:
    """Problems of a rule's ``then`` (also a policy's own ``approvers``, which shares the rule)."""
    if not isinstance(raw, dict) or not raw:
        return [f"{where}: expected an object setting risk, approval, approvers or effect"]
    problems = [
        f"{where}.{key}: unknown key; use risk, approval, approvers or effect"
        for key in sorted(raw)
        if key not in ("risk", "approval", "approvers", "effect")
    ]
    if "risk" in raw and raw["risk"] not in Risk.values:
        problems.append(f"{where}.risk: must be one of {', '.join(Risk.values)}, got {_shown(raw['risk'])}")
    if "approval" in raw and raw["approval"] not in ApprovalMode.values:
        problems.append(
            f"{where}.approval: must be one of {', '.join(ApprovalMode.values)}, got {_shown(raw['approval'])}"
        )
    if "approvers" in raw:
        problems.extend(approvers_problems(raw["approvers"], f"{where}.approvers"))
    if "effect" in raw and raw["effect"] not in EFFECTS:
        problems.append(f"{where}.effect: must be one of {', '.join(EFFECTS)}, got {_shown(raw['effect'])}")
    if raw.get("effect") == "deny" and len(raw) > 1:
        problems.append(f"{where}.effect: deny refuses the call; it sets nothing else")
    if problem := approvers_need_manual(approval=raw.get("approval"), approvers=raw.get("approvers")):
        problems.append(f"{where}.approvers: {problem}")
    return problems


def approvers_need_manual(*, approval: Any, approvers: Any) -> str:
    """The one rule between approval and approvers, for a policy and a rule's ``then`` alike: more
    than one approver means people approve, so ``approval: auto`` with them contradicts itself.
    The problem in words (its place is the caller's to say), or "" when there is none."""
    if approval == ApprovalMode.AUTO and _is_int(approvers) and approvers > 1:
        return f"{approvers} approvers need approval manual, not auto"
    return ""


def approvers_problems(value: Any, where: str) -> list[str]:
    if not _is_int(value) or not 1 <= value <= MAX_APPROVERS:
        return [f"{where}: expected a whole number from 1 to {MAX_APPROVERS}, got {_shown(value)}"]
    return []


def rules_problems(rules: Any, where: str = "rules") -> list[str]:
    """Every problem of a ``rules`` list, each naming its place (``rules[1].if.gt: …``)."""
    if not isinstance(rules, list):
        return [f"{where}: expected a list of rules"]
    if len(rules) > MAX_RULES:
        return [f"{where}: at most {MAX_RULES} rules"]
    problems: list[str] = []
    for index, rule in enumerate(rules):
        at = f"{where}[{index}]"
        if not isinstance(rule, dict):
            problems.append(f'{at}: expected an object {{"if": …, "then": …}}')
            continue
        problems.extend(
            f"{at}.{key}: unknown key; a rule has if, then and an optional description"
            for key in sorted(rule)
            if key not in ("if", "then", "description")
        )
        if "if" not in rule:
            problems.append(f"{at}.if: required")
        else:
            problems.extend(_condition_problems(rule["if"], f"{at}.if", 0))
        if "then" not in rule:
            problems.append(f"{at}.then: required")
        else:
            problems.extend(then_problems(rule["then"], f"{at}.then"))
        description = rule.get("description")
        if description is not None and (
            not isinstance(description, str) or len(description) > MAX_DESCRIPTION
        ):
            problems.append(f"{at}.description: expected a string of at most {MAX_DESCRIPTION} characters")
    return problems


def limits_problems(limits: Any, where: str = "limits") -> list[str]:
    """Every problem of a ``limits`` list, each naming its place (``limits[0].window: …``)."""
    if not isinstance(limits, list):
        return [f"{where}: expected a list of limits"]
    if len(limits) > MAX_LIMITS:
        return [f"{where}: at most {MAX_LIMITS} limits"]
    problems: list[str] = []
    for index, limit in enumerate(limits):
        at = f"{where}[{index}]"
        if not isinstance(limit, dict):
            problems.append(f"{at}: expected an object")
            continue
        known = ("window", "per", "max_count", "sum_arg", "max_sum", "on_exceed")
        problems.extend(
            f"{at}.{key}: unknown key; use {', '.join(known)}" for key in sorted(limit) if key not in known
        )
        window = limit.get("window")
        duration = _window(window)
        if "window" not in limit:
            problems.append(f"{at}.window: required (a duration such as 30s, 15m, 1h, 24h or 7d)")
        elif duration is None:
            problems.append(
                f"{at}.window: expected a duration such as 30s, 15m, 1h, 24h or 7d, got {_shown(window)}"
            )
        elif duration.seconds > MAX_WINDOW_S:
            problems.append(f"{at}.window: at most 31 days, got {_shown(window)}")
        if "per" not in limit:
            problems.append(f"{at}.per: required (agent or tenant)")
        elif limit["per"] not in PER_VALUES:
            problems.append(f"{at}.per: must be one of agent, tenant, got {_shown(limit['per'])}")
        if "on_exceed" in limit and limit["on_exceed"] not in ON_EXCEED_VALUES:
            problems.append(f"{at}.on_exceed: must be one of approve, deny, got {_shown(limit['on_exceed'])}")
        counting, summing = "max_count" in limit, ("sum_arg" in limit or "max_sum" in limit)
        if counting == summing:
            problems.append(f"{at}: needs either max_count, or sum_arg with max_sum")
        elif counting:
            value = limit["max_count"]
            if not _is_int(value) or not 1 <= value <= 1_000_000:
                problems.append(
                    f"{at}.max_count: expected a whole number from 1 to 1000000, got {_shown(value)}"
                )
        else:
            if "sum_arg" not in limit:
                problems.append(
                    f"{at}.sum_arg: required with max_sum (the dotted path of the amount in args)"
                )
            elif problem := _path_problem(limit["sum_arg"]):
                problems.append(f"{at}.sum_arg: {problem}")
            if "max_sum" not in limit:
                problems.append(f"{at}.max_sum: required with sum_arg")
            elif not is_number(limit["max_sum"]) or limit["max_sum"] <= 0:
                problems.append(f"{at}.max_sum: expected a number above 0, got {_shown(limit['max_sum'])}")
    return problems


# --- Plain words -------------------------------------------------------------------------------


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        value = int(value)
    return f"{value:,}" if isinstance(value, int | float) else str(value)


def _literal(value: Any) -> str:
    if is_number(value):
        return _number(value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


_SYMBOL = {"eq": "=", "ne": "≠", "gt": ">", "gte": "≥", "lt": "<", "lte": "≤"}


def describe_condition(raw: dict[str, Any]) -> str:
    for combinator, joiner in (("all", " and "), ("any", " or ")):
        if combinator in raw:
            parts = [describe_condition(c) for c in raw[combinator]]
            nested = [f"({p})" if len(parts) > 1 and (" and " in p or " or " in p) else p for p in parts]
            return joiner.join(nested)
    op = next(op for op in OPERATORS if op in raw)
    arg, operand = raw["arg"], raw[op]
    if op in _SYMBOL:
        return f"{arg} {_SYMBOL[op]} {_literal(operand)}"
    if op == "in":
        return f"{arg} is one of {', '.join(_literal(o) for o in operand)}"
    if op == "not_in":
        return f"{arg} is not one of {', '.join(_literal(o) for o in operand)}"
    return f"{arg} matches {_literal(operand)}"


def describe_outcome(then: Mapping[str, Any]) -> str:
    if then.get("effect") == "deny":
        return "refused"
    parts: list[str] = []
    if "risk" in then:
        parts.append(str(then["risk"]))
    raw = then.get("approvers")
    approvers = raw if _is_int(raw) else 1
    if then.get("approval") == ApprovalMode.MANUAL or approvers > 1:
        parts.append("manual approval")
    elif then.get("approval") == ApprovalMode.AUTO:
        parts.append("no approval")
    if approvers > 1:
        parts.append(f"{approvers} approvers")
    return ", ".join(parts) or "allowed"


def describe_rule(raw: Mapping[str, Any]) -> str:
    """``amount > 10,000 → critical, manual approval`` (and the file's own description, if any)."""
    words = f"{describe_condition(raw['if'])} → {describe_outcome(raw['then'])}"
    description = raw.get("description")
    return f"{words} ({description})" if description else words


def describe_window(window: str) -> str:
    duration = duration_read(window)
    return window if duration is None else duration.per()


def describe_limit(raw: Mapping[str, Any]) -> str:
    """``at most 20 per agent per hour, then manual approval``."""
    then = "then refused" if raw.get("on_exceed") == "deny" else "then manual approval"
    who = f"per {raw['per']}"
    if "max_count" in raw:
        return f"at most {_number(raw['max_count'])} {who} {describe_window(raw['window'])}, {then}"
    return (
        f"{raw['sum_arg']} summing to at most {_number(raw['max_sum'])} {who} "
        f"{describe_window(raw['window'])}, {then}"
    )
