"""Rules and limits of a tool policy: their language and compiled forms. Validated when a policy
file is loaded (``rule_checks``), compiled once per policy-table version (``rule_compile``;
``ledger.policies.resolve`` caches them with the tool policies), evaluated on every record of an
action.

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
of effect, risk, approval and approvers (``ledger.policies.resolve.ResolvedPolicy.with_args``). So a rule
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
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

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


def is_int(value: Any) -> TypeGuard[int]:
    """A whole JSON number: an int, not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


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


def operator_test(op: str, operand: Any) -> Test:
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
