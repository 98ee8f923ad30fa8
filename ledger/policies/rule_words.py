"""A policy's rules and limits in plain words: ``amount > 10,000 → critical, manual approval``,
``at most 20 per agent per hour, then manual approval`` (what the dashboard, a stamp and a refusal
show)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infra.durations import duration_read
from ledger.models import ApprovalMode
from ledger.policies.rules import OPERATORS, is_int, is_number


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
    approvers = raw if is_int(raw) else 1
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
