"""Rules fail closed on types, as a property: whatever JSON value an agent puts where a rule
compares, the policy it gets is at least as strict as the policy of every well-typed value a lenient
tool could read it as (``"5000"`` as 5000, ``["gbp"]`` as ``"gbp"``, ``true`` as 1), and never
more lenient than the policy's own. Pure functions (``ResolvedPolicy.with_args``); the same table
over HTTP is ``tests/security/test_rules_fail_closed.py``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra import errors
from ledger.models import RISK_ORDER, Risk
from ledger.policies.resolve import ResolvedPolicy
from ledger.policies.rule_compile import compile_rules

# (operator, operand, the kind a value needs for the comparison to be decided)
CONDITIONS: list[tuple[str, Any, str]] = [
    ("gt", 1000, "number"),
    ("gte", 1000, "number"),
    ("lt", 100, "number"),
    ("lte", 100, "number"),
    ("eq", "usd", "string"),
    ("ne", "usd", "string"),
    ("eq", 1, "number"),
    ("ne", 1, "number"),
    ("eq", True, "boolean"),
    ("ne", True, "boolean"),
    ("in", ["usd", "eur"], "string"),
    ("not_in", ["usd", "eur"], "string"),
    ("in", [1, 2], "number"),
    ("not_in", [1, 2], "number"),
    ("matches", "us*", "string"),
]


def _policy(risk: str, approval: str, rules: list[dict[str, Any]], approvers: int = 1) -> ResolvedPolicy:
    compiled = compile_rules(rules, [])
    assert not compiled.problems, compiled.problems
    return ResolvedPolicy(
        tool="payments.charge",
        pattern="payments.charge",
        risk=risk,
        approval=approval,
        action_class="external_irreversible",
        compensation="none",
        approvers=approvers,
        compiled=compiled,
    )


def _shapes(condition: dict[str, Any]) -> dict[str, ResolvedPolicy]:
    """One policy per way a rule can stand to the policy it overrides."""
    always = {"arg": "w", "eq": 1}  # true for every call below (w is 1)
    return {
        "tightens": _policy(
            "low", "auto", [{"if": condition, "then": {"risk": "critical", "approval": "manual"}}]
        ),
        "more approvers": _policy("high", "manual", [{"if": condition, "then": {"approvers": 3}}]),
        "relaxes": _policy(
            "high", "manual", [{"if": condition, "then": {"risk": "low", "approval": "auto"}}]
        ),
        "denies": _policy("low", "auto", [{"if": condition, "then": {"effect": "deny"}}]),
        # Both: a higher risk, but no approval where the policy wants one.
        "tightens and relaxes": _policy(
            "medium", "manual", [{"if": condition, "then": {"risk": "critical", "approval": "auto"}}]
        ),
        # A relaxing rule before a rule that relaxes further: an undecided first rule must not
        # fall through to the second when the first would have stopped there.
        "relaxes, then relaxes more": _policy(
            "critical",
            "manual",
            [
                {"if": condition, "then": {"risk": "high", "approval": "manual"}},
                {"if": always, "then": {"risk": "low", "approval": "auto"}},
            ],
        ),
        # A tightening rule before a deny: undecided, the deny still applies.
        "tightens, then denies": _policy(
            "low",
            "auto",
            [
                {"if": condition, "then": {"approval": "manual"}},
                {"if": always, "then": {"effect": "deny"}},
            ],
        ),
    }


def _outcome(policy: ResolvedPolicy, value: Any) -> tuple[int, int, int, int]:
    """(denied, risk, manual, approvers) of a call with ``v: value``: bigger is stricter."""
    try:
        applied, _ = policy.with_args({"v": value, "w": 1})
    except errors.PolicyDenied:
        return (1, 0, 0, 0)
    return (0, RISK_ORDER[Risk(applied.risk)], int(applied.requires_approval), applied.approvers)


def _at_least_as_strict(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] == 1 or (b[0] == 0 and all(x >= y for x, y in zip(a[1:], b[1:], strict=True)))


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _readings(value: Any, kind: str, depth: int = 0) -> list[Any]:
    """The well-typed values a lenient tool might read ``value`` as (the comparison needs ``kind``)."""
    if _kind(value) == kind:
        return [value]
    found: list[Any] = []
    if isinstance(value, list | dict) and depth < 2:
        for element in value if isinstance(value, list) else value.values():
            found += _readings(element, kind, depth + 1)
    elif kind == "number":
        found += _as_number(value)
    elif kind == "string":
        found += _as_string(value)
    elif kind == "boolean":
        found += _as_boolean(value)
    return found


def _as_number(value: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, bool):
        found.append(int(value))
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            found += [number, int(number)] if number.is_integer() else [number]
    elif value is None:
        found.append(0)
    return found


def _as_string(value: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, bool):
        found += ["true" if value else "false", str(value)]
    elif isinstance(value, int | float):
        found += [str(value), repr(value)]
    elif value is None:
        found += ["", "null"]
    return found


def _as_boolean(value: Any) -> list[Any]:
    found: list[Any] = []
    if isinstance(value, str):
        found += [value.strip().lower() == "true", bool(value)]
    elif isinstance(value, int | float):
        found.append(bool(value))
    elif value is None:
        found.append(False)
    return found


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["5000", "50", "1", "1.0", "usd", "USD", "eur", "gbp", "true", "NaN", "", " 1 "])
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=6,
)


@pytest.mark.parametrize(("op", "operand", "kind"), CONDITIONS, ids=[f"{c[0]}-{c[1]}" for c in CONDITIONS])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON)
def test_no_type_buys_a_relaxation(op, operand, kind, value):
    condition = {"arg": "v", op: operand}
    shapes = _shapes(condition)
    # The same policies with the condition decided either way: what a well-typed value could get.
    as_true, as_false = _shapes({"arg": "w", "eq": 1}), _shapes({"arg": "w", "eq": 2})
    for shape, policy in shapes.items():
        got = _outcome(policy, value)
        for reading in _readings(value, kind):
            assert _at_least_as_strict(got, _outcome(policy, reading)), (shape, value, reading)
        if _kind(value) != kind:
            # Whatever the tool makes of it: at least as strict as either answer.
            for decided in (as_true[shape], as_false[shape]):
                assert _at_least_as_strict(got, _outcome(decided, value)), (shape, value)


@pytest.mark.parametrize(("op", "operand", "kind"), CONDITIONS, ids=[f"{c[0]}-{c[1]}" for c in CONDITIONS])
def test_a_well_typed_value_still_gets_exactly_the_first_matching_rule(op, operand, kind):
    """The control: a value of the needed kind decides the rule as before, both ways (so the
    property above is not met by gating everything)."""
    samples = {
        "number": [0, 1, 50, 100, 1000, 5000.5],
        "string": ["usd", "eur", "gbp", "us-east"],
        "boolean": [True, False],
    }
    condition = {"arg": "v", op: operand}
    tightens, relaxes = _shapes(condition)["tightens"], _shapes(condition)["relaxes"]
    seen = set()
    for value in samples[kind]:
        matched = tightens.compiled.decide({"v": value}).matched is not None
        seen.add(matched)
        assert _outcome(tightens, value) == ((0, 3, 1, 1) if matched else (0, 0, 0, 1))
        assert _outcome(relaxes, value) == ((0, 0, 0, 1) if matched else (0, 2, 1, 1))
    assert seen == {True, False}


def test_a_rule_that_tightens_and_relaxes_keeps_only_its_tightening_parts_when_undecided():
    policy = _policy(
        "medium",
        "manual",
        [{"if": {"arg": "v", "gt": 1000}, "then": {"risk": "critical", "approval": "auto"}}],
        approvers=2,
    )
    applied, rules = policy.with_args({"v": "5000"})
    assert (applied.risk, applied.approval, applied.approvers) == ("critical", "manual", 2)
    assert rules is not None and rules.stamp()["undecided"] == ["v"]
    # Decided, the rule applies whole, as written.
    applied, _ = policy.with_args({"v": 5000})
    assert (applied.risk, applied.approval, applied.approvers) == ("critical", "auto", 1)


def test_the_stamp_names_every_rule_that_applied_and_why():
    policy = _policy(
        "low",
        "auto",
        [
            {"if": {"arg": "amount", "gt": 1000}, "then": {"approval": "manual"}},
            {"if": {"arg": "amount", "lt": 100}, "then": {"risk": "low"}},
            {"if": {"arg": "vip", "eq": True}, "then": {"risk": "high"}},
        ],
    )
    applied, rules = policy.with_args({"amount": ["5000"], "vip": True})
    assert (applied.risk, applied.approval) == ("high", "manual")
    assert rules is not None
    assert rules.stamp() == {
        "index": 0,
        "description": "amount > 1,000 → manual approval",
        "then": {"approval": "manual"},
        "undecided": ["amount"],
        # Rule 1 (a relaxation) did not apply; rule 2 matched.
        "also": [{"index": 2, "description": "vip = true → high", "then": {"risk": "high"}}],
    }
    # Nothing undecided, nothing matched: no rule.
    assert policy.with_args({"amount": 500}) == (policy, None)


def test_a_deny_undecided_by_a_value_says_so():
    policy = _policy(
        "low", "auto", [{"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}}]
    )
    with pytest.raises(errors.PolicyDenied) as refused:
        policy.with_args({"currency": ["usd"]})
    assert refused.value.details["undecided"] == ["currency"]
    assert "fail closed on types" in refused.value.message
