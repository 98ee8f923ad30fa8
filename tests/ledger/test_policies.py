"""Which policy governs a tool call."""

from __future__ import annotations

from ledger.models import PolicySet, ToolPolicy
from ledger.policies import policies_in_force, policy_resolve, policy_settings_for


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
