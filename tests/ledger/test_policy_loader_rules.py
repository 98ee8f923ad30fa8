"""manage.py load_policies with rules, limits and approvers: stored as validated, compiled for the
resolver, refused with errors that name the policy, the rule or limit and the field (and then
nothing changes), in both layouts, and per tenant with --tenant."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ledger.models import PolicySet, ToolPolicy
from ledger.policies.resolve import policy_resolve
from tests.factories import charge_policy

RULES = [
    {"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}},
    {
        "if": {"arg": "amount", "gt": 10000},
        "then": {"risk": "critical", "approval": "manual", "approvers": 2},
    },
]
LIMITS = [
    {"window": "1h", "per": "agent", "max_count": 20},
    {"window": "24h", "per": "tenant", "sum_arg": "amount", "max_sum": 100000, "on_exceed": "deny"},
]


@pytest.fixture
def write(tmp_path):
    def write(data: dict, name: str = "policies.json") -> str:
        path = tmp_path / name
        path.write_text(json.dumps(data), encoding="utf-8")
        return str(path)

    return write


def load(*args: str) -> str:
    out = StringIO()
    call_command("load_policies", *args, stdout=out)
    return out.getvalue()


def rows() -> list[tuple]:
    return list(PolicySet.objects.order_by("pk").values_list()) + list(
        ToolPolicy.objects.order_by("pk").values_list()
    )


def test_it_loads_rules_limits_and_approvers_and_compiles_them(db, tenant, write):
    path = write({"policies": [charge_policy(rules=RULES, limits=LIMITS, approvers=1)]})
    assert "2 created" in load(path)  # the policy set and the tool policy
    stored = ToolPolicy.objects.get(tool="payments.charge")
    assert (stored.rules, stored.limits, stored.approvers) == (RULES, LIMITS, 1)
    policy = policy_resolve(tenant=tenant, tool="payments.charge")
    assert [r.description for r in policy.compiled.rules] == [
        'currency is not one of "usd", "eur" → refused',
        "amount > 10,000 → critical, manual approval, 2 approvers",
    ]
    assert [limit.description for limit in policy.limits] == [
        "at most 20 per agent per hour, then manual approval",
        "amount summing to at most 100,000 per tenant per 24 hours, then refused",
    ]
    applied, rule = policy.with_args({"currency": "usd", "amount": 20000})
    assert rule is not None and rule.index == 1
    assert (applied.risk, applied.approval, applied.approvers) == ("critical", "manual", 2)
    # The same file again changes nothing.
    before = rows()
    assert "Nothing changed." in load(path)
    assert rows() == before


def test_it_names_the_policy_the_rule_and_the_field_and_changes_nothing(db, write):
    good = write({"policies": [charge_policy(rules=RULES)]}, "good.json")
    load(good)
    before = rows()
    bad = write(
        {
            "policies": [
                {"tool": "crm.note", "risk": "low", "approval": "auto", "action_class": "internal_update"},
                {
                    "tool": "hr.delete_user",
                    "risk": "high",
                    "approval": "auto",
                    "action_class": "external_reversible",
                    "approvers": 2,
                },
                charge_policy(
                    rules=[RULES[0], {"if": {"arg": "amount", "gt": "10000"}, "then": {"risk": "critical"}}],
                    limits=[
                        {"window": "1 hour", "per": "agent", "max_count": 20},
                        {"window": "1h", "per": "agent"},
                    ],
                ),
                charge_policy(tool="payments.refund", rules={"if": {}}),
            ]
        },
        "bad.json",
    )
    with pytest.raises(CommandError) as excinfo:
        load(bad)
    message = str(excinfo.value)
    assert "5 errors, nothing was changed" in message
    for line in (
        'policies[1] (tool "hr.delete_user"): approvers: 2 approvers need approval manual, not auto',
        "policies[2] (tool \"payments.charge\"): rules[1].if.gt: expected a number, got '10000'",
        'policies[2] (tool "payments.charge"): limits[0].window: expected a duration such as 30s, 15m, '
        "1h, 24h or 7d, got '1 hour'",
        'policies[2] (tool "payments.charge"): limits[1]: needs either max_count, or sum_arg with max_sum',
        'policies[3] (tool "payments.refund"): rules: expected a list of rules',
    ):
        assert line in message, message
    assert rows() == before


def test_it_refuses_rules_on_the_default_policy(db, write):
    path = write({"default_policy": {"risk": "high", "rules": RULES}})
    with pytest.raises(CommandError, match=r"default_policy: rules: unknown key"):
        load(path)


def test_it_accepts_rules_and_limits_in_the_agent_safety_layout(db, tenant, write):
    path = write(
        {
            "agentSafety": {
                "policies": {
                    "payments.refund": {
                        "risk": "MEDIUM",
                        "approval": "AUTO",
                        "compensation": "NONE",
                        "rules": [
                            {
                                "if": {"any": [{"arg": "currency", "notIn": ["usd"]}]},
                                "then": {"effect": "DENY"},
                            },
                            {
                                "if": {"arg": "amount", "gte": 500},
                                "then": {"risk": "CRITICAL", "approval": "MANUAL"},
                            },
                        ],
                        "limits": [{"window": "1h", "per": "AGENT", "maxCount": 20, "onExceed": "DENY"}],
                    }
                },
                "unwind": {"strategy": "LIFO", "timeout": "30s"},
            }
        }
    )
    load(path)
    stored = ToolPolicy.objects.get(tool="payments.refund")
    assert stored.rules[0] == {
        "if": {"any": [{"arg": "currency", "not_in": ["usd"]}]},
        "then": {"effect": "deny"},
    }
    assert stored.limits == [{"window": "1h", "per": "agent", "max_count": 20, "on_exceed": "deny"}]
    policy = policy_resolve(tenant=tenant, tool="payments.refund")
    assert policy.with_args({"currency": "usd", "amount": 600})[0].risk == "critical"


def test_it_names_an_agent_safety_rule_error_by_its_tool(db, write):
    path = write(
        {
            "agentSafety": {
                "policies": {
                    "payments.refund": {
                        "risk": "MEDIUM",
                        "approval": "AUTO",
                        "rules": [{"if": {"arg": "amount", "above": 5}, "then": {"risk": "HIGH"}}],
                    }
                }
            }
        }
    )
    with pytest.raises(CommandError) as excinfo:
        load(path)
    assert 'agentSafety.policies["payments.refund"]: rules[0].if.above: unknown operator' in str(
        excinfo.value
    )


def test_it_loads_a_file_for_one_tenant_and_the_others_keep_theirs(db, tenant, other_tenant, write):
    acme_v1 = write({"policies": [charge_policy(rules=RULES)]}, "acme1.json")
    globex = write({"policies": [charge_policy(risk="high", limits=LIMITS[:1])]}, "globex.json")
    load(acme_v1, "--tenant", tenant.slug)
    load(globex, "--tenant", other_tenant.slug)
    globex_rows = list(ToolPolicy.objects.filter(tenant=other_tenant).values_list())

    acme_v2 = write({"policies": [charge_policy(risk="low")]}, "acme2.json")
    out = load(acme_v2, "--tenant", tenant.slug)
    # One policy changed; the policy set (its defaults) did not.
    assert "into the acme scope: 0 created, 1 updated, 1 unchanged" in out
    assert list(ToolPolicy.objects.filter(tenant=other_tenant).values_list()) == globex_rows
    assert not ToolPolicy.objects.filter(tenant__isnull=True).exists()
    acme = policy_resolve(tenant=tenant, tool="payments.charge")
    assert (acme.risk, acme.compiled.rules) == ("low", ())
    globex_policy = policy_resolve(tenant=other_tenant, tool="payments.charge")
    assert (globex_policy.risk, len(globex_policy.limits)) == ("high", 1)
