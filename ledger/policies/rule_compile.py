"""Compiling a tool policy's stored rules and limits (``ledger.policies.rules``), validated again
first (a stored row may not have come through the loader): once per policy-table version, kept
with the tool policies (``ledger.policies.resolve``)."""

from __future__ import annotations

from typing import Any

from ledger.policies.rule_checks import limit_window, limits_problems, rules_problems
from ledger.policies.rule_words import describe_limit, describe_rule
from ledger.policies.rules import (
    COMBINATORS,
    NO_RULES,
    OPERATORS,
    CompiledRules,
    Condition,
    Limit,
    Rule,
    operator_test,
)


def _compile_condition(raw: dict[str, Any]) -> Condition:
    for combinator in COMBINATORS:
        if combinator in raw:
            return Condition(combinator, children=tuple(_compile_condition(c) for c in raw[combinator]))
    op = next(op for op in OPERATORS if op in raw)
    return Condition("", path=tuple(str(raw["arg"]).split(".")), test=operator_test(op, raw[op]))


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
    window = limit_window(raw["window"])
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
