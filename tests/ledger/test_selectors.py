"""Tenant isolation: another tenant's objects are simply not found."""

from __future__ import annotations

import pytest

from infra import errors
from ledger import selectors
from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.scoping import Reach
from ledger.services import keys
from tests.factories import auto_policy, make_run, record


@pytest.fixture
def outsider(outsider_key):
    return Actor.for_key(outsider_key[0])


def test_it_finds_a_run_and_an_action_of_the_tenant(tenant, agent):
    run = make_run(tenant, agent)
    action = record(run, agent, "k1")
    assert selectors.run_get(reach=Reach.of_tenants(tenant), run_id=run.pk) == run
    assert selectors.action_get(reach=Reach.of_tenants(tenant), action_id=action.pk) == action


def test_it_does_not_find_another_tenants_run_or_action(tenant, other_tenant, agent):
    run = make_run(tenant, agent)
    action = record(run, agent, "k1")
    with pytest.raises(errors.NotFound) as excinfo:
        selectors.run_get(reach=Reach.of_tenants(other_tenant), run_id=run.pk)
    assert excinfo.value.status == 404
    with pytest.raises(errors.NotFound):
        selectors.action_get(reach=Reach.of_tenants(other_tenant), action_id=action.pk)


def test_it_does_not_find_an_unknown_id(tenant):
    with pytest.raises(errors.NotFound, match="Run run_nope not found"):
        selectors.run_get(reach=Reach.of_tenants(tenant), run_id="run_nope")


def test_it_accepts_several_tenants_for_staff_lookups(tenant, other_tenant, agent, outsider):
    theirs = make_run(other_tenant, outsider)
    assert Reach.of_tenants([tenant, other_tenant]).get(Run.objects, theirs.pk) == theirs
    with pytest.raises(errors.NotFound):
        Reach.of_tenants([tenant.pk]).get(Run.objects, theirs.pk)


def test_it_records_actions_in_the_runs_tenant_whoever_asks(tenant, other_tenant, agent, outsider):
    # Policies, idempotency keys and the action row all follow the run's tenant.
    run = make_run(tenant, agent)
    action = record(run, agent, "shared-key")
    theirs = record(make_run(other_tenant, outsider), outsider, "shared-key")
    assert (action.tenant_id, theirs.tenant_id) == (tenant.pk, other_tenant.pk)
    assert Action.objects.filter(idempotency_key="shared-key").count() == 2


def test_it_resolves_policies_per_tenant(tenant, other_tenant, agent, outsider):
    auto_policy("hr.*", tenant=other_tenant)
    ours = record(make_run(tenant, agent), agent, "k")
    theirs = record(make_run(other_tenant, outsider), outsider, "k")
    assert (ours.requires_approval, theirs.requires_approval) == (True, False)


def test_it_scopes_key_authentication_to_the_keys_tenant(agent_key, outsider_key):
    assert keys.agent_key_authenticate(raw_key=agent_key[1]).tenant.slug == "acme"
    assert keys.agent_key_authenticate(raw_key=outsider_key[1]).tenant.slug == "globex"
