"""A bulk decision survives its worker being SIGKILLed mid-bulk: a new worker resumes it (the
periodic sweep hands its lost job to a new one) and no item is decided twice, because each item's
outcome is written in the transaction of its decision."""

from __future__ import annotations

from collections import Counter

import pytest

from ledger.audit import Actor
from ledger.models import Event
from recovery.actions import bulk_filter
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.models import RecoveryItem
from recovery.selectors import QueueFilter
from tests.recovery.bulk_support import crm_policies, failing_runs
from tests.support.processes import dump_worker_logs, wait_for

pytestmark = pytest.mark.timeout(330)

ITEMS = 120


def test_a_bulk_resumes_after_its_worker_is_killed_and_decides_no_item_twice(
    tenant, agent, alice, start_worker, workers, results
):
    crm_policies()
    items = failing_runs(tenant, agent, ITEMS)
    bulk = bulk_filter.bulk_start(
        tenant=tenant,
        queue_filter=QueueFilter(tool="crm.update_*"),
        action="close",
        reason="the CRM API was down",
        actor=Actor.for_user(alice),
        expected_count=ITEMS,
    )
    start_worker()
    wait_for(
        lambda: BulkOperation.objects.get(pk=bulk.pk).done >= 10,
        timeout=60,
        what="the bulk to start deciding",
    )
    workers[0].kill_hard()
    killed = BulkOperation.objects.get(pk=bulk.pk)
    assert killed.status == "running" and killed.decided < ITEMS, "the kill came too late to prove anything"

    start_worker()
    try:
        wait_for(
            lambda: BulkOperation.objects.get(pk=bulk.pk).status == "finished",
            # The killed lane's claims wait out their lease (SAGA_BULK_LEASE_S, 30 s), and a lane
            # that waits on them is re-enqueued through RQ's scheduler, whose lock the SIGKILLed
            # worker still holds until it expires (up to a minute): on a loaded machine 120 s
            # was not always enough for both.
            timeout=210,
            interval=0.2,
            what="the bulk to finish on the new worker",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc

    done = BulkOperation.objects.get(pk=bulk.pk)
    assert (done.done, done.failed, done.skipped) == (ITEMS, 0, 0)
    assert not BulkItem.objects.filter(bulk=done).exclude(outcome="done").exists()
    assert RecoveryItem.objects.filter(pk__in=[i.pk for i in items], resolution="closed").count() == ITEMS
    # Exactly one decision per item, each the operator's and naming the bulk; none refused (a second
    # attempt at an item already closed would have been refused and audited).
    resolved = Counter(
        Event.objects.filter(kind="recovery.resolved", data__bulk_id=bulk.pk).values_list("run_id", flat=True)
    )
    assert sorted(resolved) == sorted(i.run_id for i in items)
    assert set(resolved.values()) == {1}
    assert not Event.objects.filter(data__bulk_id=bulk.pk, kind__startswith="decision.").exists()
    assert not Event.objects.filter(data__bulk_id=bulk.pk, kind__contains="refused").exists()
    results.record(
        "bulk-sigkill-mid-bulk", items=ITEMS, decided_before_kill=killed.decided, duplicates_observed=0
    )


def test_parallel_lanes_lose_no_item_when_one_of_their_workers_is_killed(
    tenant, agent, alice, start_worker, workers, results
):
    """Two workers decide one bulk's lanes side by side; one is SIGKILLed holding claims. The other
    claims the killed lane's items once their lease runs out and finishes the bulk alone: every
    item decided exactly once."""
    crm_policies()
    items = failing_runs(tenant, agent, ITEMS)
    bulk = bulk_filter.bulk_start(
        tenant=tenant,
        queue_filter=QueueFilter(tool="crm.update_*"),
        action="close",
        reason="the CRM API was down",
        actor=Actor.for_user(alice),
        expected_count=ITEMS,
    )
    assert len(bulk.jobs) > 1, "the bulk should run in several lanes"
    env = {"SAGA_BULK_LEASE_S": "4"}
    start_worker(**env)
    start_worker(**env)
    wait_for(
        lambda: (
            BulkItem.objects.filter(bulk=bulk, outcome="pending").exclude(claimed_by="").count() >= 2
            and BulkOperation.objects.get(pk=bulk.pk).done >= 5
        ),
        timeout=60,
        interval=0.05,
        what="both workers to hold claims",
    )
    workers[0].kill_hard()
    killed = BulkOperation.objects.get(pk=bulk.pk)
    assert killed.status == "running", "the kill came too late to prove anything"
    try:
        wait_for(
            lambda: BulkOperation.objects.get(pk=bulk.pk).status == "finished",
            timeout=150,
            interval=0.2,
            what="the bulk to finish on the surviving worker",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc

    done = BulkOperation.objects.get(pk=bulk.pk)
    assert (done.done, done.failed, done.skipped) == (ITEMS, 0, 0)
    assert RecoveryItem.objects.filter(pk__in=[i.pk for i in items], resolution="closed").count() == ITEMS
    resolved = Counter(
        Event.objects.filter(kind="recovery.resolved", data__bulk_id=bulk.pk).values_list("run_id", flat=True)
    )
    assert sorted(resolved) == sorted(i.run_id for i in items)
    assert set(resolved.values()) == {1}
    assert not Event.objects.filter(data__bulk_id=bulk.pk, kind__contains="refused").exists()
    results.record("bulk-lanes-sigkill-one-worker", items=ITEMS, decided_before_kill=killed.decided)
