"""The periodic pass: an idle pass is one cheap question per duty and enqueues nothing;
the notification sweep reads a bounded batch through its partial index however big the outbox;
approval expiries and escalations are said as structured warnings."""

from __future__ import annotations

import logging
from datetime import timedelta

import django_rq
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.models import ToolPolicy
from recovery import scheduling, sweeper
from recovery.actions.periodic import approvals_expire
from recovery.models import Notification
from tests.factories import gated_run, load_onboarding_policies

pytestmark = pytest.mark.django_db


def _never(func: str) -> object:
    raise AssertionError(f"{func} ran although its question found nothing due")


def test_an_idle_pass_asks_one_cheap_question_per_duty_and_enqueues_nothing(own_redis, settings):
    settings.AUDIT_KEY = ""
    duties = scheduling.periodic_jobs()

    with CaptureQueriesContext(connection) as queries:
        report = scheduling.tick_report(_never)

    assert report.ran == report.enqueued == report.failed == []
    assert sorted(report.idle) == sorted(p.func for p in duties)
    # One statement per duty or fewer (head signing without a key asks none).
    assert len(queries) <= len(duties), [q["sql"][:120] for q in queries]
    for name in ("default", "compensations", "notifications"):
        assert django_rq.get_queue(name).count == 0
    # The next tick within the interval does not even ask: the duties' keys are held.
    with CaptureQueriesContext(connection) as again:
        assert scheduling.tick_report(_never).idle == []
    assert len(again) == 0


def test_a_due_housekeeping_duty_runs_in_the_pass_not_as_a_job(own_redis, tenant):
    Notification.objects.create(
        tenant=tenant,
        channel_name="lost",
        kind="webhook",
        env_target="http://127.0.0.1:9/",
        event="step.failed",
        subject_id="stp_x",
        next_attempt_at=timezone.now() - timedelta(minutes=5),
    )
    ran: list[str] = []

    def run(func: str) -> object:
        ran.append(func)
        return None

    report = scheduling.tick_report(run)

    assert ran == report.ran == ["recovery.jobs.notifications_sweep"]
    assert django_rq.get_queue("default").count == 0


def _outbox(tenant, *, delivered: int, pending: int) -> None:
    now = timezone.now()
    common = {
        "tenant": tenant,
        "channel_name": "c",
        "kind": "webhook",
        "event": "step.failed",
        "subject_id": "s",
    }
    Notification.objects.bulk_create(
        [
            Notification(status="delivered", next_attempt_at=now, delivered_at=now, **common)
            for _ in range(delivered)
        ],
        batch_size=5000,
    )
    Notification.objects.bulk_create(
        [
            Notification(status="pending", next_attempt_at=now - timedelta(minutes=10, seconds=i), **common)
            for i in range(pending)
        ]
    )


def test_the_notification_sweep_reads_a_bounded_batch_through_its_index(own_redis, tenant):
    batch = sweeper.NOTIFICATION_BATCH
    _outbox(tenant, delivered=1000, pending=batch + 50)
    sweeper._notification_cursor.clear()
    with CaptureQueriesContext(connection) as small:
        first = sweeper.notifications_sweep()
    # The rest of the backlog on the next pass (it goes on from where the last stopped).
    second = sweeper.notifications_sweep()
    assert first.read == batch and second.read == 50
    assert first.reenqueued + second.reenqueued == batch + 50  # no job in Redis: all handed again

    # Thirty times the delivered rows: the pass asks the same statements and reads the same batch.
    _outbox(tenant, delivered=30000, pending=0)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE recovery_notification")
    Notification.objects.filter(status="pending").update(job_id="")
    sweeper._notification_cursor.clear()
    with CaptureQueriesContext(connection) as big:
        again = sweeper.notifications_sweep()
    assert again.read == batch
    assert len(big) == len(small)

    now = timezone.now()
    pending_plan = sweeper.notifications_pending_due(now=now, after=None).explain()
    # From a partial index of the rows still to send (this release's, or the one before's, which
    # stays until the contract step), never the table.
    assert "notification_pending_due" in pending_plan or "notification_undelivered" in pending_plan, (
        pending_plan
    )
    sending_plan = (
        Notification.objects.filter(status="sending", lease_expires_at__lt=now)
        .order_by("lease_expires_at")
        .values_list("pk")[:batch]
        .explain()
    )
    assert "notification_sending_lease" in sending_plan, sending_plan
    assert "Seq Scan" not in pending_plan + sending_plan


def _warnings(caplog, event: str) -> list[dict]:
    return [
        r.msg
        for r in caplog.records
        if isinstance(r.msg, dict) and r.msg.get("event") == event and r.levelno >= logging.WARNING
    ]


@pytest.mark.django_db(transaction=True)
def test_an_approval_expiry_and_an_escalation_are_each_one_structured_warning(tenant, agent, caplog):
    load_onboarding_policies()
    ToolPolicy.objects.filter(tenant=None, tool="payments.refund").update(
        approval_timeout_s=60, on_timeout="escalate", escalate_to="admin"
    )
    run, _action, approval = gated_run(tenant, agent)
    caplog.set_level(logging.WARNING)

    approvals_expire(now=approval.expires_at + timedelta(seconds=1))
    [escalated] = _warnings(caplog, "approvals.escalated")
    approval.refresh_from_db()
    approvals_expire(now=approval.expires_at + timedelta(seconds=1))
    [expired] = _warnings(caplog, "approvals.expired")

    for said in (escalated, expired):
        assert said["run_id"] == run.pk and said["approval_id"] == approval.pk
        assert said["tool"] == "payments.refund" and said["reason"]
        assert {"step_id", "attempt"} <= set(said)
    assert "admin" in escalated["reason"] and expired["reason"].startswith("timed_out")


def test_a_row_whose_job_waits_behind_a_backlog_is_not_handed_a_second_job(own_redis, tenant):
    long_ago = timezone.now() - timedelta(hours=1)
    queue = django_rq.get_queue("notifications", commit_mode="auto")
    waiting = queue.enqueue("recovery.jobs.notification_deliver", notification_id="ntf_waiting")
    row = Notification.objects.create(
        tenant=tenant,
        channel_name="c",
        kind="webhook",
        env_target="http://127.0.0.1:9/",
        event="step.failed",
        subject_id="s",
        next_attempt_at=long_ago,
        job_id=waiting.id,
    )
    Notification.objects.filter(pk=row.pk).update(updated_at=long_ago)
    sweeper._notification_cursor.clear()

    # Waited far past the stale threshold, but its job is still in the queue: left to it.
    assert sweeper.notifications_sweep().reenqueued == 0
    assert queue.count == 1
    # Taken off the queue by a worker that died before starting it: handed a new job.
    queue.connection.lrem(queue.key, 0, waiting.id)
    assert sweeper.notifications_sweep().reenqueued == 1
    row.refresh_from_db()
    assert row.job_id != waiting.id and queue.count == 1
