"""The rules of a tool policy as pure functions: every operator against hostile values (true,
false or undecided: the type rule of ``ledger.policies.rules``), the validation messages, and the
plain words."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.policies.rule_checks import limits_problems, rules_problems
from ledger.policies.rule_compile import compile_rules
from ledger.policies.rule_words import describe_limit, describe_rule

HUGE = 10**400
DEEP: dict = {}
_node = DEEP
for _ in range(2000):
    _node["a"] = {}
    _node = _node["a"]

# Values an agent may send at the path a condition reads (``args.v``).
HOSTILE = {
    "missing": None,  # the path is absent
    "null": "__null__",
    "true": True,
    "false": False,
    "zero": 0,
    "float": 10000.5,
    "huge_int": HUGE,
    "neg_huge": -HUGE,
    "inf": float("inf"),
    "nan": float("nan"),
    "numeric_string": "20000",
    "nan_string": "NaN",
    "empty_string": "",
    "long_string": "x" * 100_000,
    "list": [20000],
    "dict": {"gt": 1},
    "deep": DEEP,
}


def _args(name: str) -> dict:
    value = HOSTILE[name]
    if name == "missing":
        return {"other": 1}
    return {"v": None if value == "__null__" else value}


def _truth(condition: dict, args: Any) -> bool | None:
    """The condition's answer: True, False or None (undecided by a value's kind)."""
    compiled = compile_rules([{"if": condition, "then": {"risk": "high"}}], [])
    assert not compiled.problems, compiled.problems
    return compiled.rules[0].condition.truth(args)


# Each operator against each hostile value: the names it is true for, then false for; it is
# undecided for every other one (a value of another kind than the comparison needs).
EXPECTED: list[tuple[str, Any, set[str], set[str]]] = [
    # gt 10000: only finite numbers (not booleans, not NaN, not infinities) compare.
    ("gt", 10000, {"float", "huge_int"}, {"missing", "zero", "neg_huge"}),
    ("gte", 0, {"zero", "float", "huge_int"}, {"missing", "neg_huge"}),
    ("lt", 0, {"neg_huge"}, {"missing", "zero", "float", "huge_int"}),
    ("lte", 0, {"zero", "neg_huge"}, {"missing", "float", "huge_int"}),
    # eq: the same JSON value; another value of the operand's kind is false; 0 is not false and
    # "20000" is not 20000: undecided.
    ("eq", 0, {"zero"}, {"missing", "float", "huge_int", "neg_huge"}),
    ("eq", False, {"false"}, {"missing", "true"}),
    ("eq", None, {"null"}, {"missing"}),
    ("eq", "20000", {"numeric_string"}, {"missing", "nan_string", "empty_string", "long_string"}),
    ("eq", [20000], {"list"}, {"missing"}),
    ("eq", {"gt": 1}, {"dict"}, {"missing", "deep"}),
    (
        "in",
        [0, "NaN", None],
        {"zero", "nan_string", "null"},
        {"missing", "float", "huge_int", "neg_huge", "numeric_string", "empty_string", "long_string"},
    ),
]


@pytest.mark.parametrize(("op", "operand", "true", "false"), EXPECTED)
@pytest.mark.parametrize("name", list(HOSTILE))
def test_it_decides_every_comparison_by_the_type_rule(op, operand, true, false, name):
    expected = True if name in true else False if name in false else None
    assert _truth({"arg": "v", op: operand}, _args(name)) is expected


def _not(answer: bool | None) -> bool | None:
    return None if answer is None else not answer


@pytest.mark.parametrize("name", list(HOSTILE))
def test_it_makes_ne_and_not_in_the_exact_negations_of_eq_and_in(name):
    args = _args(name)
    for operand in (0, False, None, "20000", [20000], {"gt": 1}):
        assert _truth({"arg": "v", "ne": operand}, args) is _not(_truth({"arg": "v", "eq": operand}, args))
    values = [0, "20000", None]
    assert _truth({"arg": "v", "not_in": values}, args) is _not(_truth({"arg": "v", "in": values}, args))
    # A missing path is never equal and never in, so it is always ne and not_in.
    assert _truth({"arg": "v", "ne": 1}, {}) and _truth({"arg": "v", "not_in": [1]}, {})


def test_it_never_lets_a_list_or_an_object_pass_for_a_listed_string():
    not_listed = {"arg": "currency", "not_in": ["usd", "eur"]}
    assert _truth(not_listed, {"currency": "gbp"}) is True
    assert _truth(not_listed, {"currency": "usd"}) is False
    for hostile in (["gbp"], ["usd"], {"x": 1}, {"currency": "usd"}, 1, True, None, 1.5):
        assert _truth(not_listed, {"currency": hostile}) is None, hostile
    # 1, true and "1" are three values of three kinds.
    for operand, same in ((1, 1.0), (True, True), ("1", "1")):
        assert _truth({"arg": "v", "eq": operand}, {"v": same}) is True
        for other in (1, True, "1"):
            if type(other) is not type(operand):
                assert _truth({"arg": "v", "eq": operand}, {"v": other}) is None, (operand, other)
    # Inside lists and objects too: an element of another kind leaves the comparison undecided,
    # unless another element already tells the values apart.
    assert _truth({"arg": "v", "eq": ["kp", 1]}, {"v": ["kp", "1"]}) is None
    assert _truth({"arg": "v", "eq": ["kp", 1]}, {"v": ["us", "1"]}) is False
    assert _truth({"arg": "v", "eq": {"c": "kp"}}, {"v": {"c": ["kp"]}}) is None
    assert _truth({"arg": "v", "in": [["a", "b"]]}, {"v": ["a", "c"]}) is False


@pytest.mark.parametrize("name", list(HOSTILE))
def test_it_globs_strings_only(name):
    is_string = name in ("numeric_string", "nan_string", "empty_string", "long_string")
    expected = True if is_string else False if name == "missing" else None
    assert _truth({"arg": "v", "matches": "*"}, _args(name)) is expected
    expected_2x0 = (name == "numeric_string") if is_string or name == "missing" else None
    assert _truth({"arg": "v", "matches": "2*0"}, _args(name)) is expected_2x0


def test_it_reads_deep_paths_and_list_indexes_and_tells_missing_from_malformed():
    args = {"customer": {"address": {"country": "FR"}}, "items": [{"sku": "A"}, {"sku": "B"}]}
    assert _truth({"arg": "customer.address.country", "eq": "FR"}, args) is True
    assert _truth({"arg": "items.1.sku", "eq": "B"}, args) is True
    # Missing: an object without the key, a list index past the end.
    assert _truth({"arg": "items.2.sku", "eq": "B"}, args) is False
    assert _truth({"arg": "customer.name", "eq": "B"}, args) is False
    # Malformed: a list read by a name, a string read as an object; and an object compared as a
    # number. Each is another shape than the policy reads: undecided, never "absent".
    assert _truth({"arg": "items.x.sku", "eq": "B"}, args) is None
    assert _truth({"arg": "customer.address.country.code", "eq": "FR"}, args) is None
    assert _truth({"arg": "customer", "gt": 1}, args) is None
    assert _truth({"arg": "customer.address.country", "in": ["KP"]}, {"customer": [{"address": {}}]}) is None
    # A path runs only as deep as it is written, whatever the agent nests.
    assert _truth({"arg": "v.a.a.a", "eq": {"a": {}}}, {"v": DEEP}) is False
    assert _truth({"arg": "v.a.a", "ne": 1}, {"v": DEEP}) is None
    # Not an object at the root either: a list of args, or a string.
    assert _truth({"arg": "0", "eq": 1}, [1]) is True
    assert _truth({"arg": "0", "eq": 1}, "1") is None


def test_it_combines_three_answers_as_kleene_does():
    t, f, u = {"arg": "t", "eq": 1}, {"arg": "t", "eq": 2}, {"arg": "u", "eq": 1}
    args = {"t": 1, "u": "1"}
    assert [_truth(c, args) for c in (t, f, u)] == [True, False, None]
    table = [
        ("all", [t, u], None),
        ("all", [f, u], False),
        ("all", [t, t], True),
        ("any", [f, u], None),
        ("any", [t, u], True),
        ("any", [f, f], False),
    ]
    for combinator, children, expected in table:
        assert _truth({combinator: children}, args) is expected, (combinator, children)


def test_it_takes_the_first_true_rule_and_keeps_the_undecided_ones_before_it():
    compiled = compile_rules(
        [
            {"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}},
            {
                "if": {
                    "all": [
                        {"arg": "amount", "gt": 100},
                        {"any": [{"arg": "vip", "eq": True}, {"arg": "n", "lt": 0}]},
                    ]
                },
                "then": {"risk": "critical", "approval": "manual", "approvers": 2},
            },
            {"if": {"arg": "amount", "gt": 100}, "then": {"risk": "high"}},
        ],
        [],
    )
    assert compiled.decide({"currency": "gbp", "amount": 5}).matched.index == 0
    assert compiled.decide({"currency": "usd", "amount": 500, "vip": True}).matched.index == 1
    decision = compiled.decide({"currency": "usd", "amount": 500, "vip": 1})
    assert decision.matched.index == 2
    assert [(a.index, a.undecided) for a in decision.undecided] == [(1, ("vip",))]
    assert compiled.decide({"currency": "usd", "amount": 50}).matched is None
    decision = compiled.decide({"currency": ["usd"], "amount": "500"})
    assert decision.matched is None
    # Rule 1 is false whatever amount is: neither vip nor n is there.
    assert [(a.index, a.undecided) for a in decision.undecided] == [(0, ("currency",)), (2, ("amount",))]


def test_it_names_every_bad_place_in_rules():
    problems = rules_problems(
        [
            {"if": {"arg": "amount", "gt": "10000"}, "then": {"risk": "critical"}},
            {"if": {"arg": "amount", "gt": 1, "lt": 5}, "then": {"approval": "sometimes"}},
            {"if": {"any": []}, "then": {"effect": "deny", "risk": "low"}},
            {"if": {"arg": "a..b", "in": "usd"}, "then": {"approvers": True}},
            {"if": {"all": [{"arg": "x", "between": [1, 2]}]}, "then": {"approval": "auto", "approvers": 3}},
            {"when": {}, "then": {"risk": "low"}},
            {"if": {"arg": "amount", "gt": float("nan")}, "then": {"risk": "low"}},
            "deny",
        ]
    )
    assert problems == [
        "rules[0].if.gt: expected a number, got '10000'",
        "rules[1].if: one operator per condition, got gt, lt (combine them with all)",
        "rules[1].then.approval: must be one of auto, manual, got 'sometimes'",
        "rules[2].if.any: expected a non-empty list of conditions",
        "rules[2].then.effect: deny refuses the call; it sets nothing else",
        "rules[3].if.arg: 'a..b' is not a dotted path (empty segment or whitespace)",
        "rules[3].if.in: expected a non-empty list, got 'usd'",
        "rules[3].then.approvers: expected a whole number from 1 to 10, got True",
        "rules[4].if.all[0].between: unknown operator; use one of eq, ne, gt, gte, lt, lte, in, not_in, "
        "matches (with arg), or all/any",
        "rules[4].then.approvers: 3 approvers need approval manual, not auto",
        "rules[5].when: unknown key; a rule has if, then and an optional description",
        "rules[5].if: required",
        "rules[6].if.gt: expected a number, got nan",
        'rules[7]: expected an object {"if": …, "then": …}',
    ]


def test_it_refuses_conditions_nested_too_deep():
    condition: dict = {"arg": "a", "eq": 1}
    for _ in range(8):
        condition = {"all": [condition]}
    [problem] = rules_problems([{"if": condition, "then": {"risk": "low"}}])
    assert "nest at most 6 deep" in problem


def test_it_names_every_bad_place_in_limits():
    assert limits_problems(
        [
            {"window": "1y", "per": "agent", "max_count": 20},
            {"window": "32d", "per": "team", "max_count": 0},
            {"window": "1h", "per": "tenant", "sum_arg": "amount"},
            {"window": "1h", "per": "tenant", "max_count": 5, "max_sum": 5, "on_exceed": "warn"},
            {"per": "agent", "max_count": 1.5},
        ]
    ) == [
        "limits[0].window: expected a duration such as 30s, 15m, 1h, 24h or 7d, got '1y'",
        "limits[1].window: at most 31 days, got '32d'",
        "limits[1].per: must be one of agent, tenant, got 'team'",
        "limits[1].max_count: expected a whole number from 1 to 1000000, got 0",
        "limits[2].max_sum: required with sum_arg",
        "limits[3].on_exceed: must be one of approve, deny, got 'warn'",
        "limits[3]: needs either max_count, or sum_arg with max_sum",
        "limits[4].window: required (a duration such as 30s, 15m, 1h, 24h or 7d)",
        "limits[4].max_count: expected a whole number from 1 to 1000000, got 1.5",
    ]


def test_it_fails_closed_on_stored_rules_the_loader_never_saw():
    compiled = compile_rules([{"if": {"arg": "amount", "gt": "big"}, "then": {"risk": "low"}}], [])
    assert compiled.problems == ("rules[0].if.gt: expected a number, got 'big'",)


def test_it_says_rules_and_limits_in_plain_words():
    assert (
        describe_rule(
            {"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approval": "manual"}}
        )
        == "amount > 10,000 → critical, manual approval"
    )
    assert (
        describe_rule({"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}})
        == 'currency is not one of "usd", "eur" → refused'
    )
    assert (
        describe_rule(
            {
                "if": {
                    "any": [
                        {"all": [{"arg": "a", "gte": 1}, {"arg": "b", "eq": True}]},
                        {"arg": "c", "matches": "x*"},
                    ]
                },
                "then": {"approvers": 2},
                "description": "two people for VIPs",
            }
        )
        == '(a ≥ 1 and b = true) or c matches "x*" → manual approval, 2 approvers (two people for VIPs)'
    )
    assert (
        describe_limit({"window": "1h", "per": "agent", "max_count": 20})
        == "at most 20 per agent per hour, then manual approval"
    )
    assert (
        describe_limit(
            {"window": "24h", "per": "tenant", "sum_arg": "amount", "max_sum": 100000, "on_exceed": "deny"}
        )
        == "amount summing to at most 100,000 per tenant per 24 hours, then refused"
    )
    assert describe_limit({"window": "30s", "per": "agent", "max_count": 1}).startswith(
        "at most 1 per agent per 30 seconds"
    )


def test_it_refuses_nan_and_infinities_in_any_operand():
    # Python's JSON reader takes NaN and Infinity in a policy file; such an operand is never equal
    # to anything, so a rule on it could never be decided.
    assert rules_problems(
        [
            {"if": {"arg": "a", "eq": float("nan")}, "then": {"risk": "high"}},
            {"if": {"arg": "a", "not_in": ["usd", [float("inf")]]}, "then": {"effect": "deny"}},
            {"if": {"arg": "a", "ne": {"x": -float("inf")}}, "then": {"risk": "high"}},
        ]
    ) == [
        "rules[0].if.eq: NaN and infinities compare with nothing; remove them",
        "rules[1].if.not_in: NaN and infinities compare with nothing; remove them",
        "rules[2].if.ne: NaN and infinities compare with nothing; remove them",
    ]
