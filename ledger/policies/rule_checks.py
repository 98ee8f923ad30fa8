"""Validating a policy's rules and limits (the loader's check, and ``rule_compile``'s of a stored
row): every problem at once, each naming its exact place (``rules[1].if.gt: expected a number,
got '10000'``)."""

from __future__ import annotations

import math
import re
from typing import Any

from infra.durations import Duration, duration_read
from ledger.models import ApprovalMode, Risk
from ledger.policies.rules import (
    COMBINATORS,
    COMPARISONS,
    EFFECTS,
    MAX_APPROVERS,
    MAX_BRANCHES,
    MAX_DEPTH,
    MAX_DESCRIPTION,
    MAX_LIMITS,
    MAX_LIST,
    MAX_PATH_LENGTH,
    MAX_PATH_SEGMENTS,
    MAX_RULES,
    MAX_WINDOW_S,
    ON_EXCEED_VALUES,
    OPERATORS,
    PER_VALUES,
    is_int,
    is_number,
)

_SEGMENT = re.compile(r"^[^.\s]{1,100}$")


def limit_window(value: Any) -> Duration | None:
    """A limit's window (``infra.durations``): a whole number of seconds above 0, written as a
    duration; None for anything else."""
    duration = duration_read(value) if isinstance(value, str) else None
    if duration is None or not isinstance(duration.seconds, int) or duration.seconds < 1:
        return None
    return duration


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
        return _combination_problems(raw, where, depth, combinators[0])
    return _leaf_problems(raw, where)


def _combination_problems(raw: dict[str, Any], where: str, depth: int, name: str) -> list[str]:
    """An ``all``/``any`` condition: its own shape, then each of its conditions."""
    if len(raw) != 1:
        return [f"{where}: {name} stands alone (no other keys beside it)"]
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


def _leaf_problems(raw: dict[str, Any], where: str) -> list[str]:
    """A condition on one arg: its keys, its path, one operator and that operator's operand."""
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
        if problem := _operand_problem(op, raw[op]):
            problems.append(f"{where}.{op}: {problem}")
    return problems


def _operand_problem(op: str, operand: Any) -> str:
    """What is wrong with an operator's operand ("" when nothing is)."""
    if op in COMPARISONS and not is_number(operand):
        return f"expected a number, got {_shown(operand)}"
    if op in ("in", "not_in"):
        if not isinstance(operand, list) or not operand:
            return f"expected a non-empty list, got {_shown(operand)}"
        if len(operand) > MAX_LIST:
            return f"at most {MAX_LIST} values"
        if _has_non_finite(operand):
            return "NaN and infinities compare with nothing; remove them"
    elif op in ("eq", "ne") and _has_non_finite(operand):
        return "NaN and infinities compare with nothing; remove them"
    elif op == "matches" and (not isinstance(operand, str) or not operand):
        return f"expected a glob pattern (a non-empty string), got {_shown(operand)}"
    return ""


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
    if approval == ApprovalMode.AUTO and is_int(approvers) and approvers > 1:
        return f"{approvers} approvers need approval manual, not auto"
    return ""


def approvers_problems(value: Any, where: str) -> list[str]:
    if not is_int(value) or not 1 <= value <= MAX_APPROVERS:
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
        problems.extend(_window_problems(limit, at))
        if "per" not in limit:
            problems.append(f"{at}.per: required (agent or tenant)")
        elif limit["per"] not in PER_VALUES:
            problems.append(f"{at}.per: must be one of agent, tenant, got {_shown(limit['per'])}")
        if "on_exceed" in limit and limit["on_exceed"] not in ON_EXCEED_VALUES:
            problems.append(f"{at}.on_exceed: must be one of approve, deny, got {_shown(limit['on_exceed'])}")
        problems.extend(_measure_problems(limit, at))
    return problems


def _window_problems(limit: dict[str, Any], at: str) -> list[str]:
    """A limit's ``window``: required, a duration (``limit_window``), at most 31 days."""
    window = limit.get("window")
    duration = limit_window(window)
    if "window" not in limit:
        return [f"{at}.window: required (a duration such as 30s, 15m, 1h, 24h or 7d)"]
    if duration is None:
        return [f"{at}.window: expected a duration such as 30s, 15m, 1h, 24h or 7d, got {_shown(window)}"]
    if duration.seconds > MAX_WINDOW_S:
        return [f"{at}.window: at most 31 days, got {_shown(window)}"]
    return []


def _measure_problems(limit: dict[str, Any], at: str) -> list[str]:
    """What a limit measures: either a count (``max_count``) or a sum (``sum_arg`` with
    ``max_sum``)."""
    counting, summing = "max_count" in limit, ("sum_arg" in limit or "max_sum" in limit)
    if counting == summing:
        return [f"{at}: needs either max_count, or sum_arg with max_sum"]
    problems: list[str] = []
    if counting:
        value = limit["max_count"]
        if not is_int(value) or not 1 <= value <= 1_000_000:
            problems.append(f"{at}.max_count: expected a whole number from 1 to 1000000, got {_shown(value)}")
        return problems
    if "sum_arg" not in limit:
        problems.append(f"{at}.sum_arg: required with max_sum (the dotted path of the amount in args)")
    elif problem := _path_problem(limit["sum_arg"]):
        problems.append(f"{at}.sum_arg: {problem}")
    if "max_sum" not in limit:
        problems.append(f"{at}.max_sum: required with sum_arg")
    elif not is_number(limit["max_sum"]) or limit["max_sum"] <= 0:
        problems.append(f"{at}.max_sum: expected a number above 0, got {_shown(limit['max_sum'])}")
    return problems
