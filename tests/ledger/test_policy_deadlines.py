"""Approval deadlines in a policy file (API.md, "Approval deadlines per policy"): ``approval_timeout``,
``on_timeout`` and ``escalate_to`` in both layouts and the default policy, stored and shown by
GET /api/v1/policies and the policies page; every bad or hostile value is a load error naming its
entry, and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import ToolPolicy
from ledger.policies.errors import PolicyFileError
from ledger.policies.resolve import policy_resolve
from tests.factories import load_policy_file, member
from tests.support.api import Api

pytestmark = pytest.mark.django_db


def _refund(**fields: Any) -> dict[str, Any]:
    return {
        "tool": "payments.refund",
        "risk": "high",
        "approval": "manual",
        "action_class": "external_irreversible",
        "compensation": "none",
        **fields,
    }


def _problems(data: dict[str, Any], **options: Any) -> list[str]:
    with pytest.raises(PolicyFileError) as caught:
        load_policy_file(data, **options)
    return caught.value.problems


def test_it_stores_a_policys_deadline_and_resolves_it(tenant):
    load_policy_file(
        {
            "default_policy": {"approval_timeout": "1d", "on_timeout": "reject"},
            "policies": [_refund(approval_timeout="15m", on_timeout="escalate", escalate_to="admin")],
        },
        tenant=tenant,
    )
    row = ToolPolicy.objects.get(tool="payments.refund")
    assert (row.approval_timeout_s, row.on_timeout, row.escalate_to) == (900, "escalate", "admin")
    policy = policy_resolve(tenant=tenant, tool="payments.refund")
    assert (policy.approval_timeout_s, policy.on_timeout, policy.escalate_to) == (900, "escalate", "admin")
    fallback = policy_resolve(tenant=tenant, tool="crm.anything")
    assert (fallback.approval_timeout_s, fallback.on_timeout, fallback.escalate_to) == (86400, "reject", "")


def test_the_agent_safety_layout_says_the_same(tenant, bob):
    load_policy_file(
        {
            "agentSafety": {
                "policies": {
                    "payments.refund": {
                        "risk": "HIGH",
                        "approval": "MANUAL",
                        "compensation": "NONE",
                        "approvalTimeout": "2h",
                        "onTimeout": "ESCALATE",
                        "escalateTo": "bob",
                    }
                }
            }
        },
        tenant=tenant,
    )
    row = ToolPolicy.objects.get(tool="payments.refund")
    assert (row.approval_timeout_s, row.on_timeout, row.escalate_to) == (7200, "escalate", "bob")


def test_a_file_without_deadlines_keeps_the_global_default(tenant, settings):
    load_policy_file({"policies": [_refund()]}, tenant=tenant)
    row = ToolPolicy.objects.get(tool="payments.refund")
    assert (row.approval_timeout_s, row.on_timeout, row.escalate_to) == (None, "reject", "")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"approval_timeout": -5}, "approval_timeout: must be a duration string"),
        ({"approval_timeout": "-5m"}, "approval_timeout: must be a duration such as"),
        ({"approval_timeout": "0s"}, "must be at least 1s and at most 30d"),
        ({"approval_timeout": "31d"}, "must be at least 1s and at most 30d"),
        ({"approval_timeout": "9" * 5000}, "approval_timeout: must be a duration such as"),
        ({"approval_timeout": "1e9s"}, "approval_timeout: must be a duration such as"),
        ({"approval_timeout": "500ms"}, "must be a whole number of seconds"),
        ({"approval_timeout": True}, "approval_timeout: must be a duration string"),
        ({"approval_timeout": ["2h"]}, "approval_timeout: must be a duration string"),
        ({"approval_timeout": {"h": 2}}, "approval_timeout: must be a duration string"),
        ({"approval_timeout": "2 fortnights"}, "approval_timeout: must be a duration such as"),
        ({"on_timeout": "approve"}, "a deadline never approves"),
        ({"on_timeout": "APPROVE"}, "on_timeout: must be one of reject, escalate"),
        ({"on_timeout": 1}, "on_timeout: must be one of reject, escalate"),
        ({"on_timeout": "escalate"}, "escalate_to: is required with on_timeout escalate"),
        ({"escalate_to": "admin"}, 'escalate_to: applies only with "on_timeout": "escalate"'),
        ({"on_timeout": "escalate", "escalate_to": "operator"}, "the operator role cannot approve"),
        ({"on_timeout": "escalate", "escalate_to": "viewer"}, "the viewer role cannot approve"),
        ({"on_timeout": "escalate", "escalate_to": ""}, "escalate_to: must be a role that approves"),
        ({"on_timeout": "escalate", "escalate_to": "x" * 151}, "escalate_to: must be a role that approves"),
        (
            {"on_timeout": "escalate", "escalate_to": "bob\nsmith"},
            "escalate_to: must be a role that approves",
        ),
        ({"on_timeout": "escalate", "escalate_to": ["admin"]}, "escalate_to: must be a role that approves"),
        (
            {"on_timeout": "escalate", "escalate_to": "bob", "approvers": 2},
            "one person (bob) cannot give the 2 grants",
        ),
    ],
)
def test_a_bad_deadline_is_a_load_error_naming_its_entry_and_changes_nothing(tenant, bob, fields, message):
    load_policy_file({"policies": [_refund(approval_timeout="1h")]}, tenant=tenant)
    problems = _problems({"policies": [_refund(**fields)]}, tenant=tenant)
    assert len(problems) == 1, problems
    assert problems[0].startswith('policies[0] (tool "payments.refund"): '), problems
    assert message in problems[0], problems
    assert ToolPolicy.objects.get(tool="payments.refund").approval_timeout_s == 3600


def test_a_rules_then_cannot_set_a_deadline(tenant):
    rules = [{"if": {"arg": "amount", "gt": 100}, "then": {"approval": "manual", "approval_timeout": "5m"}}]
    [problem] = _problems({"policies": [_refund(rules=rules)]}, tenant=tenant)
    assert "rules[0].then.approval_timeout: unknown key" in problem


def test_the_default_policy_and_the_agent_safety_layout_name_their_place(tenant):
    [problem] = _problems({"default_policy": {"on_timeout": "approve"}}, tenant=tenant)
    assert problem.startswith("default_policy: on_timeout:") and "never approves" in problem
    [problem] = _problems(
        {
            "agentSafety": {
                "policies": {
                    "payments.refund": {
                        "risk": "HIGH",
                        "approval": "MANUAL",
                        "compensation": "NONE",
                        "approvalTimeout": -1,
                    }
                }
            }
        },
        tenant=tenant,
    )
    assert problem.startswith('agentSafety.policies["payments.refund"]: approval_timeout:'), problem


def test_escalating_to_someone_who_cannot_decide_in_the_scope_is_refused(
    tenant, other_tenant, alice, mallory
):
    member(other_tenant, "globex-approver", "approver")
    for who in ("nobody-by-that-name", "alice", "mallory", "globex-approver"):
        [problem] = _problems({"policies": [_refund(on_timeout="escalate", escalate_to=who)]}, tenant=tenant)
        assert f"escalate_to: '{who}' is neither a role that approves" in problem
        assert f"active approver or admin of tenant {tenant.slug}" in problem
    assert not ToolPolicy.objects.exists()
    # An unknown role is refused the same way (it is not a role, so it must be a person).
    [problem] = _problems({"policies": [_refund(on_timeout="escalate", escalate_to="superadmin")]})
    assert "'superadmin' is neither a role that approves" in problem and "of any tenant" in problem
    # A global policy may name an approver of some tenant.
    load_policy_file({"policies": [_refund(on_timeout="escalate", escalate_to="globex-approver")]})
    assert ToolPolicy.objects.get(tenant=None).escalate_to == "globex-approver"


def test_the_api_and_the_policies_page_show_the_deadlines(tenant, agent_key, client, dave):
    load_policy_file(
        {
            "default_policy": {"approval_timeout": "2h"},
            "policies": [
                _refund(approval_timeout="15m", on_timeout="escalate", escalate_to="admin"),
                _refund(
                    tool="crm.update_contact", risk="low", approval="auto", action_class="internal_update"
                ),
            ],
        },
        tenant=tenant,
    )
    body = Api(agent_key[1]).get("/policies").json()
    shown = {p["tool"]: p for p in body["policies"]}
    refund = shown["payments.refund"]
    assert (refund["approval_timeout"], refund["on_timeout"], refund["escalate_to"]) == (
        "15m",
        "escalate",
        "admin",
    )
    crm = shown["crm.update_contact"]
    assert (crm["approval_timeout"], crm["on_timeout"], crm["escalate_to"]) == ("1d", "reject", None)
    assert body["default_policy"]["approval_timeout"] == "2h"
    assert "approval_timeout_s" not in body["default_policy"]

    client.force_login(dave)
    page = client.get("/policies/").content.decode()
    assert "decided within 15m, else escalated to admin (rejected after another 15m)" in page
    assert "decided within 1d, else rejected" in page
    assert "decided within 2h, else rejected" in page
