"""The one vocabulary of tenant scoping (ledger.scoping): the owner rule of an API key, and what a
reach narrows (another tenant's or another agent's object is not found, never forbidden)."""

from __future__ import annotations

import pytest

from infra import errors
from ledger import selectors
from ledger.audit import Actor
from ledger.models import Run
from ledger.scoping import Reach
from ledger.services.keys import agent_key_create
from tests.factories import make_run, record


def _key(tenant, name, scopes):
    return agent_key_create(tenant=tenant, name=name, scopes=scopes, actor=Actor.system("tests")).key


def test_an_agent_key_reaches_its_own_agents_runs_reading_and_writing(tenant, agent_key):
    key = agent_key[0]
    assert Reach.of_key(key) == Reach((tenant.pk,), owner=key.name)
    assert Reach.of_key(key, write=True) == Reach((tenant.pk,), owner=key.name)


def test_an_operator_key_reads_its_whole_tenant_but_writes_as_its_agent(tenant, operator_key):
    key = operator_key[0]
    assert Reach.of_key(key) == Reach((tenant.pk,))
    assert Reach.of_key(key, write=True) == Reach((tenant.pk,), owner=key.name)


def test_another_agents_run_is_not_found_for_an_agent_key(tenant, agent, agent_key, operator_key):
    other = _key(tenant, "other-agent", ["agent"])
    theirs = make_run(tenant, Actor.for_key(other))
    action = record(theirs, Actor.for_key(other), "k1")
    for write in (False, True):
        with pytest.raises(errors.NotFound, match=f"Run {theirs.pk} not found"):
            selectors.run_get(reach=Reach.of_key(agent_key[0], write=write), run_id=theirs.pk)
        with pytest.raises(errors.NotFound):
            selectors.action_get(reach=Reach.of_key(agent_key[0], write=write), action_id=action.pk)
    # The operator key reads it, and writes to it no more than any other agent.
    assert selectors.run_get(reach=Reach.of_key(operator_key[0]), run_id=theirs.pk) == theirs
    with pytest.raises(errors.NotFound):
        selectors.run_get(reach=Reach.of_key(operator_key[0], write=True), run_id=theirs.pk)


def test_another_tenants_run_is_not_found_whatever_the_key(tenant, other_tenant, agent, outsider_key):
    ours = make_run(tenant, agent)
    for write in (False, True):
        with pytest.raises(errors.NotFound):
            selectors.run_get(reach=Reach.of_key(outsider_key[0], write=write), run_id=ours.pk)
    assert selectors.archived_run_get(reach=Reach.of_key(outsider_key[0]), run_id=ours.pk) is None


def test_a_reference_reaches_its_tenant_and_the_owner_it_carries(tenant, agent, agent_key):
    run = make_run(tenant, agent)
    key = agent_key[0]
    assert (
        Reach.of_reference(selectors.run_reference_for_write(key=key, run_id=run.pk)).first(
            Run.objects, run.pk, owner_field="owner"
        )
        == run
    )
    stranger = Run(pk=run.pk, tenant=tenant, owner="someone-else")
    assert Reach.of_reference(stranger).first(Run.objects, run.pk, owner_field="owner") is None
    assert Reach.of_reference(Run(pk=run.pk, tenant=tenant)) == Reach((tenant.pk,))


def test_an_owners_reach_refuses_to_narrow_what_names_no_owner(tenant, agent_key):
    with pytest.raises(ValueError):
        Reach.of_key(agent_key[0]).q()
    assert Reach.of_tenants(tenant) == Reach.of_tenants([tenant.pk]) == Reach((tenant.pk,))
