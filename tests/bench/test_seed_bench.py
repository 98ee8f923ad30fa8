"""``manage.py seed_bench`` (the dashboard's benchmark data, built by the same row builder as the
size seed, without audit events): the counts it asks for, rows consistent with the state
machines, and the options the bulk phase relies on (one tenant, one reason, nothing claimed)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from ledger.models import Action, Event, Run
from recovery.models import Approval, RecoveryItem

pytestmark = pytest.mark.django_db(transaction=True)


def _seed(**options: object) -> str:
    out = io.StringIO()
    call_command("seed_bench", seed=7, stdout=out, **options)
    return out.getvalue()


def test_it_seeds_the_runs_items_and_approvals_it_is_asked_for():
    output = _seed(
        runs=60, actions_per_run=3, open_items=12, pending_approvals=6, resolved_items=8, big_runs=1,
        big_run_actions=25,
    )  # fmt: skip

    unresolved = RecoveryItem.objects.filter(status__in=["open", "claimed"])
    resolved = RecoveryItem.objects.filter(status="resolved")
    approvals = Approval.objects.filter(status="pending")
    assert Run.objects.count() == 60 and Action.objects.count() == 59 * 3 + 25
    # The big run is a failed run in the queue, in place of whichever fate it drew.
    assert 12 <= unresolved.count() <= 13 and 7 <= resolved.count() <= 8 and 5 <= approvals.count() <= 6
    assert (
        f"seeded 60 runs, {59 * 3 + 25} actions, {unresolved.count()} open items ({resolved.count()} "
        f"resolved), {approvals.count()} pending approvals" in output
    )
    # No audit events: a half-made chain would be worse than none.
    assert not Event.objects.filter(run__isnull=False).exists()
    assert all(r.action_count == Action.objects.filter(run=r).count() for r in Run.objects.all())
    # An open item's run failed at its last action; a pending approval's action waits for it.
    for item in unresolved.select_related("run"):
        assert item.run.status == "failed"
        assert Action.objects.get(pk=item.failed_action_id).status == "failed"
    assert set(
        Action.objects.filter(pk__in=approvals.values("action_id")).values_list("status", flat=True)
    ) == {"awaiting_approval"}
    assert Run.objects.filter(action_count=25, status="failed").exists()


def test_it_makes_one_tenants_incident_of_one_reason_with_nothing_claimed():
    _seed(
        runs=30, actions_per_run=3, open_items=30, pending_approvals=0, resolved_items=0, big_runs=0,
        tenant="bench-bulk", reason="failed", claimed_share=0.0,
    )  # fmt: skip

    items = RecoveryItem.objects.all()
    assert items.count() == 30
    assert set(items.values_list("tenant__slug", "reason", "status")) == {("bench-bulk", "failed", "open")}
