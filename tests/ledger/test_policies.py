"""Which policy governs a tool call."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import PolicySet, ToolPolicy
from ledger.policies.resolve import policies_in_force, policy_resolve, policy_settings_for
from tests.factories import auto_policy, make_run, record


def _policy(tool, *, tenant=None, risk="low", approval="auto", action_class="internal_update", **fields):
    return ToolPolicy.objects.create(
        tenant=tenant, tool=tool, risk=risk, approval=approval, action_class=action_class, **fields
    )


def test_it_prefers_an_exact_name_over_any_glob(tenant):
    _policy("crm.update_*", risk="low", tenant=tenant)
    _policy("crm.update_contact", risk="critical", approval="manual")
    resolved = policy_resolve(tenant=tenant, tool="crm.update_contact")
    assert (resolved.pattern, resolved.risk, resolved.scope, resolved.requires_approval) == (
        "crm.update_contact",
        "critical",
        "global",
        True,
    )


def test_it_prefers_the_tenants_policy_over_the_global_one(tenant, other_tenant):
    _policy("hr.create_user", risk="low")
    _policy("hr.create_user", risk="high", tenant=tenant)
    assert policy_resolve(tenant=tenant, tool="hr.create_user").risk == "high"
    assert policy_resolve(tenant=tenant, tool="hr.create_user").scope == "tenant"
    # Another tenant's override does not leak: Globex still gets the global policy.
    assert policy_resolve(tenant=other_tenant, tool="hr.create_user").risk == "low"


def test_it_prefers_the_tenants_glob_over_a_global_glob(tenant):
    _policy("crm.update_*", risk="low")
    _policy("crm.*", risk="medium", tenant=tenant)
    assert policy_resolve(tenant=tenant, tool="crm.update_contact").risk == "medium"


def test_it_prefers_the_longer_glob(tenant):
    _policy("crm.*", risk="medium")
    _policy("crm.update_*", risk="low")
    assert policy_resolve(tenant=tenant, tool="crm.update_contact").pattern == "crm.update_*"
    assert policy_resolve(tenant=tenant, tool="crm.delete_contact").pattern == "crm.*"


def test_it_matches_globs_case_sensitively(tenant):
    _policy("crm.update_*")
    assert policy_resolve(tenant=tenant, tool="CRM.update_contact").scope == "default"


def test_it_gives_an_unknown_tool_the_built_in_conservative_default(tenant):
    resolved = policy_resolve(tenant=tenant, tool="github.delete_repository")
    assert (resolved.scope, resolved.risk, resolved.approval, resolved.action_class, resolved.source) == (
        "default",
        "high",
        "manual",
        "external_irreversible",
        "built-in",
    )


def test_it_gives_an_unknown_tool_the_configured_default(tenant):
    PolicySet.objects.create(tenant=None, default_policy={"risk": "critical"}, source="global.json")
    resolved = policy_resolve(tenant=tenant, tool="unknown.tool")
    # Configured fields win; the rest stays the built-in conservative default.
    assert (resolved.risk, resolved.approval, resolved.source) == ("critical", "manual", "global.json")


def test_it_layers_a_tenants_policy_set_over_the_global_one(tenant, other_tenant):
    PolicySet.objects.create(tenant=None, default_policy={"risk": "critical"}, unwind={"max_attempts": 3})
    PolicySet.objects.create(tenant=tenant, default_policy={}, unwind={"step_timeout_s": 60})
    ours = policy_settings_for(tenant)
    # The tenant file says nothing about the default policy: the global one still applies.
    assert ours.default_policy["risk"] == "critical"
    assert (ours.unwind["max_attempts"], ours.unwind["step_timeout_s"]) == (3, 60)
    assert policy_settings_for(other_tenant).unwind["step_timeout_s"] == 30


def test_it_lists_the_policies_in_force_for_a_tenant(tenant, other_tenant):
    _policy("hr.create_user", risk="low")
    _policy("hr.create_user", risk="high", tenant=tenant)
    _policy("crm.*")
    _policy("secret.*", tenant=other_tenant)
    in_force = policies_in_force(tenant=tenant)
    assert [(p.tool, p.tenant_id) for p in in_force] == [("crm.*", None), ("hr.create_user", tenant.pk)]


# --- The per-process cache of the tool-policy table, validated by PolicyStamp -------------------


def _record(tenant, agent, key: str):
    return record(make_run(tenant, agent), agent, key, tool="hr.create_user")


def test_it_reads_the_tool_policies_once_while_they_are_unchanged(tenant, agent):
    auto_policy("hr.*")
    _record(tenant, agent, "first")
    with CaptureQueriesContext(connection) as queries:
        _record(tenant, agent, "second")
    assert not [q["sql"] for q in queries.captured_queries if "ledger_toolpolicy" in q["sql"]]


def test_a_tightened_policy_applies_to_the_very_next_recording(tenant, agent):
    """No staleness window: an approval gate that lagged a tightened policy would be a hole."""
    policy = auto_policy("hr.*")
    assert not _record(tenant, agent, "before").requires_approval
    ToolPolicy.objects.filter(pk=policy.pk).update(approval="manual", risk="high")
    tightened = _record(tenant, agent, "after")
    assert (tightened.requires_approval, tightened.risk) == (True, "high")
    ToolPolicy.objects.filter(pk=policy.pk).delete()
    assert _record(tenant, agent, "removed").policy["pattern"] == "*default*"


def test_a_policy_written_with_raw_sql_moves_the_stamp_too(tenant, agent):
    auto_policy("hr.*")
    _record(tenant, agent, "before")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_toolpolicy SET approval = 'manual' WHERE tool = 'hr.*'")
    assert _record(tenant, agent, "after").requires_approval
