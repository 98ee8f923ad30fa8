"""Policy rules on arguments and limits, through the whole URL stack: a deny rule refuses (403
``policy_denied``, nothing recorded, audited), an escalating rule makes a large charge critical and
gated, hostile args never crash the server and fail closed on their type, and limits count per agent (by key name) or per
tenant, by number or by sum."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.audit import Actor
from ledger.models import Action, Event, Run
from ledger.services.keys import agent_key_create
from tests.factories import charge_policy, load_policy_file, new_run
from tests.support.api import Api, error_of

RULES = [
    {"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}},
    {"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approval": "manual"}},
]


def _charge(api: Api, run_id: str, key: str, **args):
    return api.post(
        f"/runs/{run_id}/actions",
        {
            "tool": "payments.charge",
            "target_type": "customer",
            "target_id": "cus_42",
            "args": {"currency": "usd", "amount": 50, **args},
            "idempotency_key": key,
        },
    )


def _key(tenant, name: str, scopes=("agent",)) -> Api:
    issued = agent_key_create(tenant=tenant, name=name, scopes=list(scopes), actor=Actor.system("tests"))
    return Api(issued.secret)


# --- Rules ---------------------------------------------------------------------------------------


def test_it_refuses_a_call_a_rule_denies_and_records_nothing(db, api):
    load_policy_file({"policies": [charge_policy(rules=RULES)]})
    run = new_run(api)
    response = _charge(api, run["id"], "charge-gbp", currency="gbp")
    assert response.status_code == 403, response.content
    error = error_of(response)
    assert error["code"] == "policy_denied"
    assert error["details"] == {
        "policy": "payments.charge",
        "rule": 0,
        "description": 'currency is not one of "usd", "eur" → refused',
    }
    assert "rule 0" in error["message"] and "Nothing was recorded" in error["message"]
    assert not Action.objects.exists()
    assert Run.objects.get(pk=run["id"]).action_count == 0
    refused = Event.objects.get(run_id=run["id"], kind="action.refused")
    assert refused.data["code"] == "policy_denied"
    assert refused.data["details"]["rule"] == 0
    assert refused.data["idempotency_key"] == "charge-gbp"
    # The same key may be used again for a call the policy allows: nothing was kept of the refusal.
    assert _charge(api, run["id"], "charge-gbp").status_code == 201


def test_it_escalates_a_large_charge_to_critical_with_manual_approval(db, api):
    load_policy_file({"policies": [charge_policy(rules=RULES)]})
    run = new_run(api)
    small = _charge(api, run["id"], "small", amount=10000).json()
    assert (small["status"], small["risk"], small["requires_approval"]) == ("planned", "medium", False)
    assert small["policy"]["rule"] is None
    large = _charge(api, run["id"], "large", amount=12500).json()
    assert (large["status"], large["risk"], large["requires_approval"]) == (
        "awaiting_approval",
        "critical",
        True,
    )
    assert large["approval"]["status"] == "pending" and large["approval"]["risk"] == "critical"
    assert large["policy"]["rule"] == {
        "index": 1,
        "description": "amount > 10,000 → critical, manual approval",
        "then": {"risk": "critical", "approval": "manual"},
    }
    assert (large["policy"]["risk"], large["policy"]["approval"]) == ("critical", "manual")
    recorded = Event.objects.get(subject_id=large["id"], kind="action.recorded")
    assert recorded.data["rule"]["index"] == 1
    assert recorded.data["risk"] == "critical"
    # What was decided stays with the action when the policy file changes.
    load_policy_file({"policies": [charge_policy()]})
    assert api.get(f"/actions/{large['id']}").json()["policy"]["rule"]["index"] == 1


@pytest.mark.parametrize(
    "amount",
    [
        "20000",  # a numeric string is not a number: the escalation applies (fail closed)
        "5",
        "NaN",
        True,
        None,
        [20000],
        {"value": 20000},
        10**300,  # huge, but a number: escalated
        -(10**300),  # a number, and small: not escalated
        1e308,
        9999.5,
    ],
)
def test_it_never_crashes_on_hostile_args_and_fails_closed_on_their_type(db, api, amount):
    load_policy_file({"policies": [charge_policy(rules=RULES)]})
    run = new_run(api)
    response = _charge(api, run["id"], "hostile", amount=amount)
    assert response.status_code == 201, response.content
    body = response.json()
    is_number = isinstance(amount, int | float) and not isinstance(amount, bool)
    escalated = amount > 10000 if is_number else True
    assert body["requires_approval"] is escalated
    assert (body["policy"]["rule"] is not None) is escalated
    if not is_number:
        assert body["policy"]["rule"]["undecided"] == ["amount"]


def test_it_reads_nested_paths_and_denies_a_missing_currency(db, api):
    load_policy_file(
        {
            "policies": [
                charge_policy(
                    rules=[
                        {
                            "if": {"arg": "customer.address.country", "in": ["KP", "IR"]},
                            "then": {"effect": "deny"},
                        },
                        *RULES,
                    ]
                )
            ]
        }
    )
    run = new_run(api)
    denied = _charge(api, run["id"], "sanctioned", customer={"address": {"country": "KP"}})
    assert error_of(denied)["details"]["rule"] == 0
    # A country of another shape is not "not KP": the deny applies (rules fail closed on types).
    deep = {"address": {"country": {"nested": ["KP"] * 1000}}}
    assert error_of(_charge(api, run["id"], "deep", customer=deep))["details"]["undecided"] == [
        "customer.address.country"
    ]
    assert _charge(api, run["id"], "elsewhere", customer={"address": {"country": "FR"}}).status_code == 201
    # A missing path never equals and is never in: not_in matches it, so no currency is refused.
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.charge", "args": {"amount": 5}, "idempotency_key": "nocur"},
    )
    assert (response.status_code, error_of(response)["details"]["rule"]) == (403, 1)


def test_it_needs_two_people_when_a_rule_says_so(db, api):
    rules = [{"if": {"arg": "amount", "gte": 50000}, "then": {"risk": "critical", "approvers": 2}}]
    load_policy_file({"policies": [charge_policy(rules=rules)]})
    run = new_run(api)
    body = _charge(api, run["id"], "huge", amount=50000).json()
    assert body["status"] == "awaiting_approval"
    assert body["policy"]["approvers"] == 2
    assert body["approval"]["approvers_required"] == 2 and body["approval"]["grants"] == []


# --- Limits --------------------------------------------------------------------------------------


def test_it_escalates_past_a_count_limit_and_counts_only_what_was_not_rejected(db, api, approver_key):
    load_policy_file({"policies": [charge_policy(limits=[{"window": "1h", "per": "agent", "max_count": 2}])]})
    run = new_run(api)
    first, second, third = (_charge(api, run["id"], f"c-{n}").json() for n in range(3))
    assert [a["status"] for a in (first, second, third)] == ["planned", "planned", "awaiting_approval"]
    assert first["policy"]["limit"] is None
    assert third["policy"]["limit"]["description"] == "at most 2 per agent per hour, then manual approval"
    assert third["policy"]["limit"]["used"] == 2
    # Awaiting approval counts (it was recorded); once rejected it does not.
    assert _charge(api, run["id"], "c-3").json()["status"] == "awaiting_approval"
    approver = Api(approver_key[1])
    rejected = approver.post(f"/approvals/{third['approval']['id']}/reject", {"reason": "too many"})
    assert rejected.status_code == 200
    assert _charge(api, run["id"], "c-4").json()["status"] == "awaiting_approval"  # c-0, c-1, c-3


def test_it_refuses_past_a_denying_limit(db, api):
    limits = [{"window": "15m", "per": "tenant", "max_count": 1, "on_exceed": "deny"}]
    load_policy_file({"policies": [charge_policy(limits=limits)]})
    run = new_run(api)
    assert _charge(api, run["id"], "once").status_code == 201
    response = _charge(api, run["id"], "twice")
    assert response.status_code == 403
    error = error_of(response)
    assert error["code"] == "policy_denied"
    assert error["details"] == {
        "policy": "payments.charge",
        "limit": 0,
        "description": "at most 1 per tenant per 15 minutes, then refused",
    }
    assert Action.objects.count() == 1
    assert (
        Event.objects.filter(run_id=run["id"], kind="action.refused", data__code="policy_denied").count() == 1
    )
    # Other tools are not counted.
    other = api.post(
        f"/runs/{run['id']}/actions", {"tool": "crm.note", "args": {}, "idempotency_key": "note"}
    )
    assert other.status_code == 201


def test_it_sums_an_arg_over_the_window(db, api):
    limits = [{"window": "24h", "per": "tenant", "sum_arg": "amount", "max_sum": 1000, "on_exceed": "deny"}]
    load_policy_file({"policies": [charge_policy(limits=limits)]})
    run = new_run(api)
    assert _charge(api, run["id"], "a", amount=600).status_code == 201
    assert _charge(api, run["id"], "b", amount=400).status_code == 201  # exactly 1000
    over = _charge(api, run["id"], "c", amount=0.5)
    assert (over.status_code, error_of(over)["details"]["limit"]) == (403, 0)
    # A negative amount adds nothing and takes nothing away.
    assert _charge(api, run["id"], "refund-trick", amount=-5000).status_code == 201
    assert _charge(api, run["id"], "d", amount=1).status_code == 403
    # An amount that is not a finite number cannot be shown to stay within the limit.
    for key, amount in (("s", "1"), ("m", None), ("n", "NaN"), ("l", [1]), ("t", True), ("o", {"amount": 1})):
        assert _charge(api, run["id"], key, amount=amount).status_code == 403, amount


def test_it_escalates_a_sum_with_a_missing_amount(db, api):
    limits = [{"window": "7d", "per": "agent", "sum_arg": "payment.amount", "max_sum": 100}]
    load_policy_file({"policies": [charge_policy(limits=limits)]})
    run = new_run(api)
    assert _charge(api, run["id"], "ok", payment={"amount": 100}).json()["status"] == "planned"
    missing = _charge(api, run["id"], "missing").json()
    assert missing["status"] == "awaiting_approval"
    assert missing["policy"]["limit"]["this"] is None
    # A path that runs through another shape is no better than a missing one.
    malformed = _charge(api, run["id"], "malformed", payment=[{"amount": 1}]).json()
    assert (malformed["status"], malformed["policy"]["limit"]["this"]) == ("awaiting_approval", None)


def test_it_counts_per_agent_by_key_name_not_by_declared_agent(db, tenant, api, agent_key):
    load_policy_file({"policies": [charge_policy(limits=[{"window": "1h", "per": "agent", "max_count": 2}])]})
    first_run = new_run(api, agent="billing")
    assert _charge(api, first_run["id"], "a").json()["status"] == "planned"
    assert _charge(api, first_run["id"], "b").json()["status"] == "planned"
    # A new run declaring another agent name does not escape: the key's name is the agent.
    renamed = new_run(api, agent="a-fresh-innocent-agent")
    assert _charge(api, renamed["id"], "c").json()["status"] == "awaiting_approval"
    # Neither does another key issued under the same name (key rotation: the same agent).
    rotated = _key(tenant, "onboarding-agent")
    rotated_run = new_run(rotated, agent="yet-another-name")
    assert _charge(rotated, rotated_run["id"], "d").json()["status"] == "awaiting_approval"
    # Another agent (another key name) has its own count.
    other = _key(tenant, "billing-agent")
    other_run = new_run(other, agent="onboarding-agent")
    assert _charge(other, other_run["id"], "e").json()["status"] == "planned"
    assert set(Action.objects.values_list("owner", flat=True)) == {"onboarding-agent", "billing-agent"}


def test_it_counts_per_tenant_across_agents_and_never_across_tenants(db, tenant, api, outsider_api):
    load_policy_file(
        {"policies": [charge_policy(limits=[{"window": "1h", "per": "tenant", "max_count": 1}])]}
    )
    assert _charge(api, new_run(api)["id"], "a").json()["status"] == "planned"
    other = _key(tenant, "billing-agent")
    assert _charge(other, new_run(other)["id"], "b").json()["status"] == "awaiting_approval"
    assert _charge(outsider_api, new_run(outsider_api)["id"], "c").json()["status"] == "planned"


def test_it_lets_an_old_action_leave_the_window(db, api):
    load_policy_file(
        {"policies": [charge_policy(limits=[{"window": "30s", "per": "agent", "max_count": 1}])]}
    )
    run = new_run(api)
    first = _charge(api, run["id"], "old").json()
    assert _charge(api, run["id"], "new").json()["status"] == "awaiting_approval"
    Action.objects.filter(pk=first["id"]).update(created_at=timezone.now() - timedelta(seconds=31))
    Action.objects.exclude(pk=first["id"]).update(created_at=timezone.now() - timedelta(seconds=31))
    assert _charge(api, run["id"], "later").json()["status"] == "planned"


def test_it_replays_an_action_without_counting_it_again(db, api):
    load_policy_file({"policies": [charge_policy(limits=[{"window": "1h", "per": "agent", "max_count": 1}])]})
    run = new_run(api)
    first = _charge(api, run["id"], "same")
    replay = _charge(api, run["id"], "same")
    assert (first.status_code, replay.status_code) == (201, 200)
    assert replay.json()["status"] == "planned"


def test_it_lists_rules_limits_and_approvers_with_the_policies(db, api):
    limits = [{"window": "1h", "per": "agent", "max_count": 20}]
    load_policy_file(
        {"policies": [charge_policy(rules=RULES, limits=limits, approval="manual", approvers=2)]}
    )
    [policy] = api.get("/policies").json()["policies"]
    assert (policy["rules"], policy["limits"], policy["approvers"]) == (RULES, limits, 2)
