"""For bulk decisions and the archiver: every error is one structured log event
at WARNING or above, naming what it is about (the bulk, run and item; the tenant) and the reason,
so an operator's log search finds each one once."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from ledger.audit import Actor
from ledger.models import Action
from recovery import jobs
from recovery.actions import bulk_filter, bulk_worker
from recovery.selectors import QueueFilter
from tests.recovery.archive_support import KEY, age, allow, closed_run, folder_url, retention
from tests.recovery.bulk_support import crm_policies, failing_runs

pytestmark = pytest.mark.django_db


def test_each_refused_bulk_item_is_one_warning_naming_its_run_and_reason(tenant, agent, alice):
    crm_policies()
    items = failing_runs(tenant, agent, 3, undoable=True)
    # Each run's undoable action's outcome is unknown: compensating it is refused (outcome_unknown).
    Action.objects.filter(run_id__in=[i.run_id for i in items], tool="crm.create_note").update(
        status=Action.Status.UNKNOWN
    )
    bulk = bulk_filter.bulk_start(
        tenant=tenant,
        queue_filter=QueueFilter(tool="crm.update_*"),
        action="compensate",
        reason="undo them",
        actor=Actor.for_user(alice),
        expected_count=3,
    )
    with capture_logs() as logs:
        while bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk):
            pass
    bulk.refresh_from_db()
    assert (bulk.status, bulk.failed) == ("finished", 3)
    failed = [e for e in logs if e["event"] == "bulk.item_failed"]
    assert sorted(e["run"] for e in failed) == sorted(i.run_id for i in items)
    assert {e["log_level"] for e in failed} == {"warning"}
    assert all(e["bulk_id"] == bulk.pk and e["reason"] == "outcome_unknown" for e in failed)


def test_an_archiver_error_is_one_structured_event(tenant, agent, settings, tmp_path):
    settings.AUDIT_KEY = KEY
    base = tmp_path / "archive"
    base.mkdir()
    allow(settings, folder_url(base))
    retention(tenant, folder_url(base))
    age(closed_run(tenant, agent))
    allow(settings, "file:///somewhere/else")
    with capture_logs() as logs:
        assert jobs.runs_archive()["errors"] == 1
    errors = [e for e in logs if e["log_level"] in ("warning", "error", "critical")]
    assert len(errors) == 1, errors
    assert errors[0]["event"] == "archive.error" and errors[0]["tenant"] == tenant.slug
    assert errors[0]["reason"] == "retention_unusable" and "operator allows" in errors[0]["message"]
