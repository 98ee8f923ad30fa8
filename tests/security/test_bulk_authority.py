"""A bulk decision does not outlive its starter's authority. The worker acts as
the stored user or key across up to 50,000 items; each chunk re-checks that they may still decide
in the tenant, and a bulk whose starter lost the right stops (``aborted``, ``abort_code``
``authority_lost``), is audited, and says why. The attack: start a bulk, lose the right (fired,
demoted, key revoked, scope taken away), and let the worker go on deciding as you."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.audit import Actor
from ledger.models import AgentKey, Event, Membership
from ledger.services.keys import agent_key_revoke
from ledger.staff import membership_remove, membership_set
from recovery.actions import bulk_filter, bulk_worker
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.models import RecoveryItem
from recovery.selectors import QueueFilter
from tests.recovery.bulk_support import crm_policies, failing_runs

pytestmark = pytest.mark.django_db

ITEMS = 4
ADMIN = Actor.system("tests")


def _deactivate(alice: Any, key: AgentKey) -> None:
    alice.is_active = False
    alice.save(update_fields=["is_active"])


def _demote(alice: Any, key: AgentKey) -> None:
    membership_set(user=alice, tenant=key.tenant, role=Membership.Role.VIEWER, actor=ADMIN)


def _remove(alice: Any, key: AgentKey) -> None:
    membership_remove(membership=Membership.objects.get(user=alice, tenant=key.tenant), actor=ADMIN)


def _revoke(alice: Any, key: AgentKey) -> None:
    agent_key_revoke(key=key, actor=ADMIN)


def _unscope(alice: Any, key: AgentKey) -> None:
    AgentKey.objects.filter(pk=key.pk).update(scopes=["agent"])


LOSSES: dict[str, tuple[str, Callable[[Any, AgentKey], None], str]] = {
    "user deactivated": ("user", _deactivate, "deactivated"),
    "user demoted to viewer": ("user", _demote, "no longer an operator"),
    "user removed from the tenant": ("user", _remove, "no longer an operator"),
    "key revoked": ("key", _revoke, "revoked"),
    "key lost the operator scope": ("key", _unscope, "operator scope"),
}


@pytest.mark.parametrize("loss", list(LOSSES), ids=list(LOSSES))
def test_a_bulk_stops_when_its_starter_loses_the_right_to_decide(loss, tenant, agent, alice, operator_key):
    who, lose, says = LOSSES[loss]
    key = operator_key[0]
    crm_policies()
    items = failing_runs(tenant, agent, ITEMS)
    starter = Actor.for_user(alice) if who == "user" else Actor.for_key(key)
    bulk = bulk_filter.bulk_start(
        tenant=tenant,
        queue_filter=QueueFilter(tool="crm.update_*"),
        action="close",
        reason="the CRM API was down",
        actor=starter,
        expected_count=ITEMS,
    )
    # The first chunk runs while the starter may decide.
    assert bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk, max_items=1)
    assert BulkOperation.objects.get(pk=bulk.pk).done == 1

    lose(alice, key)
    # The worker's next chunks: not one more item is decided as someone who may no longer decide.
    while bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk, max_items=1):
        pass

    stopped = BulkOperation.objects.get(pk=bulk.pk)
    assert (stopped.status, stopped.done) == ("aborted", 1)
    assert stopped.abort_code == "authority_lost"
    assert says in stopped.abort_reason and stopped.finished_at is not None
    assert BulkItem.objects.filter(bulk=stopped, outcome="pending").count() == ITEMS - 1
    assert RecoveryItem.objects.filter(pk__in=[i.pk for i in items], status="open").count() == ITEMS - 1
    # Audited on the tenant's chain, by the system, saying why.
    event = Event.objects.get(kind="bulk.aborted", data__bulk_id=bulk.pk)
    assert event.data["cause"] == "authority_lost" and says in event.reason
    assert event.actor_type == Event.ActorType.SYSTEM


def test_a_bulk_goes_on_while_its_starter_keeps_the_right(tenant, agent, alice, dave):
    """The re-check refuses only a lost right: an admin who became an operator still decides."""
    crm_policies()
    failing_runs(tenant, agent, 2)
    bulk = bulk_filter.bulk_start(
        tenant=tenant,
        queue_filter=QueueFilter(tool="crm.update_*"),
        action="close",
        reason="the CRM API was down",
        actor=Actor.for_user(dave),
        expected_count=2,
    )
    assert bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk, max_items=1)
    membership_set(user=dave, tenant=tenant, role=Membership.Role.OPERATOR, actor=ADMIN)
    while bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk, max_items=1):
        pass
    done = BulkOperation.objects.get(pk=bulk.pk)
    assert (done.status, done.abort_code, done.done) == ("finished", "", 2)
