"""The sweeper: finds committed work that nobody is carrying out and hands it to a worker again.

PostgreSQL is the source of truth and Redis only carries work, so a lost job (Redis restarted, a
worker SIGKILLed with its work horse, an enqueue while Redis was down) leaves a trace in the
database: a running step whose lease expired, a queued step whose job is gone, a running unwind
with nothing in flight whose advance job is gone. The worker's ticker runs ``sweep`` every
SAGA_SWEEP_INTERVAL_S.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone
from rq.job import JobStatus

from infra.conf import saga
from ledger.transitions import compare_and_set_rows
from recovery import approval_deadlines, queueing
from recovery.compensators import Outcome
from recovery.models import Notification, Unwind, UnwindStep
from recovery.notifications.delivery import NOTIFICATION_TRANSITIONS
from recovery.unwinds.advance import unwind_advance_move
from recovery.unwinds.dispatch import drive_job_timeout, enqueue_step, step_lease_seconds, step_timeout_of
from recovery.unwinds.runner import step_log_fields, step_record_outcome
from recovery.unwinds.state import ENGINE, IN_FLIGHT, step_transition

log = structlog.get_logger(__name__)


@dataclass
class SweepReport:
    leases_expired: int = 0
    reenqueued: int = 0
    advanced: int = 0


def sweep(*, now: datetime | None = None) -> SweepReport:
    """Find committed work that nobody is carrying out and hand it to a worker again."""
    now = now or timezone.now()
    report = SweepReport()
    interval = saga().sweep_interval_s

    # 1. A running step whose lease expired: its worker died (or was SIGKILLed with its horse).
    expired = UnwindStep.objects.filter(status=UnwindStep.Status.RUNNING, lease_expires_at__lt=now)
    for step_id in expired.order_by("lease_expires_at").values_list("pk", flat=True)[:STEP_BATCH]:
        if _step_lease_expired(step_id=step_id, now=now):
            report.leases_expired += 1

    # 2. A queued step that is due but whose job is gone (Redis restarted or was down when it
    # was enqueued), or has waited implausibly long (a job stuck "started" by a dead worker).
    report.reenqueued = _queued_steps_reenqueue(now=now, interval=interval)

    # 3. A running unwind with nothing in flight whose advance job will not run: Redis lost it (or
    # was down when it was enqueued), or its work horse died before claiming a step. One still
    # waiting in the queue is left to its job: advancing it here would queue its step with a
    # job of its own and leave the advance job nothing to do, two jobs where one does, which is
    # what a backlog of unwinds started together (or any queue longer than a sweep) got. A job
    # handed over less than a sweep interval ago may not be in Redis yet (the transaction that
    # recorded it has committed, and its enqueue follows; after a commit that started hundreds
    # of unwinds, the last ones follow a second or two later): the next sweep looks again.
    report.advanced = _idle_unwinds_advance(now=now, interval=interval)
    return report


# The rows one pass of ``sweep`` reads of each kind: bounded under any backlog.
STEP_BATCH = 200

# Where the last pass over the queued steps stopped (by id, per process): a backlog longer than a
# batch is looked at in turn. Back to the start after a short batch.
_step_cursor: dict[str, str] = {}


def _queued_steps_reenqueue(*, now: datetime, interval: float) -> int:
    """``sweep``'s second duty: the queued steps handed to a job again (how many)."""
    reenqueued = 0
    queued = UnwindStep.objects.filter(status=UnwindStep.Status.QUEUED, unwind__status=Unwind.Status.RUNNING)
    if "queued" in _step_cursor:
        queued = queued.filter(pk__gt=_step_cursor["queued"])
    steps = list(queued.select_related("unwind").order_by("pk")[:STEP_BATCH])
    if len(steps) < STEP_BATCH:
        _step_cursor.pop("queued", None)
    else:
        _step_cursor["queued"] = steps[-1].pk
    due = [step for step in steps if (step.next_attempt_at or step.updated_at) <= now]
    states = queueing.job_states([step.job_id for step in due], queue="compensations")
    if states is None:
        return 0  # Redis is down: nothing can be enqueued now; the next sweep tries again
    stale = []
    for step, state in zip(due, states, strict=True):
        due_at = step.next_attempt_at or step.updated_at
        waited = (now - max(due_at, step.updated_at)).total_seconds()
        if not queueing.job_is_alive(state) or waited > max(
            3 * interval, step_lease_seconds(step_timeout_s=step_timeout_of(step.unwind))
        ):
            stale.append((step, state))
    # A job still waiting in the queue's list is not lost however long the backlog before it (a
    # second job would only lengthen it); one taken off the list and never started is.
    in_queue = _still_in_queue([(s.job_id, state) for s, state in stale], queue="compensations")
    for step, state in stale:
        if step.job_id in in_queue:
            continue
        job_id = queueing.enqueue(
            "recovery.jobs.step_run",
            queue="compensations",
            step_id=step.pk,
            job_timeout=drive_job_timeout(step_timeout_s=step_timeout_of(step.unwind)),
        )
        if job_id:
            UnwindStep.objects.filter(pk=step.pk, status=UnwindStep.Status.QUEUED).update(
                job_id=job_id, updated_at=timezone.now()
            )
            reenqueued += 1
            log.info("unwinds.step_reenqueued", step_id=step.pk, previous_job=step.job_id, job_state=state)
    return reenqueued


def _idle_unwinds_advance(*, now: datetime, interval: float) -> int:
    """``sweep``'s third duty: the running unwinds with nothing in flight advanced (how many)."""
    advanced = 0
    for unwind_id, job_id in (
        Unwind.objects.filter(status=Unwind.Status.RUNNING, updated_at__lt=now - timedelta(seconds=interval))
        .exclude(steps__status__in=IN_FLIGHT)
        .order_by("updated_at")
        .values_list("pk", "job_id")[:STEP_BATCH]
    ):
        will_run = queueing.job_will_run(job_id, queue="compensations", started_within_s=3 * interval)
        if will_run is None:
            break  # Redis is down: nothing can be enqueued now; the next sweep looks again
        if will_run:
            continue
        unwind_advance_move(unwind_id=unwind_id)
        advanced += 1
    return advanced


@transaction.atomic
def _step_lease_expired(*, step_id: str, now: datetime) -> bool:
    # The unwind before the step, the order every other writer takes them in (unwind_stop locks
    # the unwind, then its steps); a locked unwind is busy, so the next sweep looks again.
    unwind_id = UnwindStep.objects.filter(pk=step_id).values_list("unwind_id", flat=True).first()
    unwind = (
        Unwind.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("run__tenant")
        .filter(pk=unwind_id)
        .first()
    )
    if unwind is None:
        return False
    step = (
        UnwindStep.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("action")
        .filter(pk=step_id, status=UnwindStep.Status.RUNNING, lease_expires_at__lt=now)
        .first()
    )
    if step is None:
        return False
    step.unwind = unwind
    message = f"Lease expired after attempt {step.attempts}: the worker running the step was lost."
    if step.attempts >= step.max_attempts or unwind.status == Unwind.Status.CANCELLED:
        # Out of attempts, or its unwind was stopped (nothing is retried after a stop): the step
        # fails, naming why (recovery.unwinds.runner records a stopped unwind's step as not retried).
        # The token is left as is: the lost worker (if it ever wakes) is fenced by the status.
        step_record_outcome(
            step_id=step.pk,
            token=step.lease_token,
            outcome=Outcome.retry(
                message if unwind.status == Unwind.Status.CANCELLED else message + " No attempts left."
            ),
        )
        return True
    step_transition(
        step,
        to=UnwindStep.Status.QUEUED,
        allowed_from=(UnwindStep.Status.RUNNING,),
        actor=ENGINE,
        kind="step.lease_expired",
        reason=message,
        where={"lease_token": step.lease_token},
        updates={"lease_expires_at": None, "next_attempt_at": now, "error": message, "job_id": ""},
        data={"attempt": step.attempts, "lease_token": step.lease_token},
    )
    enqueue_step(step.pk, step_timeout_s=step_timeout_of(step.unwind))
    log.warning("unwinds.step_retried", **step_log_fields(step), reason=message, cause="lease_expired")
    return True


# --- Notifications ---------------------------------------------------------------------------


@dataclass
class NotificationSweepReport:
    reenqueued: int = 0
    given_up: int = 0
    reminders: int = 0
    # How many rows the pass read (at most NOTIFICATION_BATCH of each kind): bounded, however long
    # the outbox grows.
    read: int = 0


# The rows one pass reads of each kind (due pending rows, sending rows whose lease expired).
NOTIFICATION_BATCH = 200

# Where the last pass over the due pending rows stopped, per process: the next pass goes on from
# there (next_attempt_at, id), so a backlog longer than a batch is looked at in turn, not the same
# oldest batch over and over. Back to the start after a short batch.
_notification_cursor: dict[str, tuple[datetime | None, str]] = {}


def notifications_pending_due(
    *, now: datetime, after: tuple[datetime | None, str] | None
) -> QuerySet[Notification, tuple[str, str, datetime, datetime | None]]:
    """The sweep's batch of due pending rows after ``after`` (next_attempt_at, id), in that order,
    from the partial index ``notification_pending_due``."""
    pending = Notification.objects.filter(status=Notification.Status.PENDING, next_attempt_at__lte=now)
    if after is not None:
        pending = pending.filter(
            Q(next_attempt_at__gt=after[0]) | Q(next_attempt_at=after[0], pk__gt=after[1])
        )
    return pending.order_by("next_attempt_at", "pk").values_list(
        "pk", "job_id", "updated_at", "next_attempt_at"
    )[:NOTIFICATION_BATCH]


def _still_in_queue(jobs: list[tuple[str, str]], *, queue: str) -> set[str]:
    """Of these (job id, state) pairs, the ids of ``queued`` jobs still in the queue's list (one
    round trip). Redis down: none (the caller's enqueue fails too, and the next sweep looks again)."""
    queued = [job_id for job_id, state in jobs if job_id and state == JobStatus.QUEUED.value]
    dropped = queueing.jobs_not_in_queue(queued, queue=queue)
    return set() if dropped is None else set(queued) - dropped


def _notifications_lost(
    rows: list[tuple[str, str, datetime]], states: list[str], *, now: datetime, stale_s: float
) -> list[str]:
    """``notifications_sweep``'s rows to hand a job again: its job is gone or finished, or it has
    waited implausibly long and its job is not waiting in the queue (started by a worker that
    died, taken off the queue and never started, left scheduled). A job still waiting in the
    queue is not lost however long the backlog: handing it a second job would only lengthen the
    backlog (each pass another job per row)."""
    stale = [
        (notification_id, job_id, state)
        for (notification_id, job_id, updated_at), state in zip(rows, states, strict=True)
        if not queueing.job_is_alive(state) or (now - updated_at).total_seconds() >= stale_s
    ]
    in_queue = _still_in_queue([(job_id, state) for _pk, job_id, state in stale], queue="notifications")
    return [notification_id for notification_id, job_id, _state in stale if job_id not in in_queue]


def notifications_sweep(*, now: datetime | None = None) -> NotificationSweepReport:
    """Hand undelivered outbox rows to a worker again: a pending row that is due but whose job is
    gone (Redis was down when it was enqueued, or restarted empty) or has waited implausibly long,
    and a sending row whose lease expired (its worker died mid-send). Then remind approvers of the
    approvals half way through their window (``recovery.approval_deadlines``). A second job for a
    row is harmless: one claim wins.

    Each kind is read through its partial index (``notification_pending_due``,
    ``notification_sending_lease``: recovery/migrations/0016) in a batch of at most
    NOTIFICATION_BATCH, the jobs' states asked of Redis in one round trip: the pass costs the
    same with a thousand rows delivered or ten million."""
    now = now or timezone.now()
    report = NotificationSweepReport()
    stale_s = max(3 * saga().sweep_interval_s, saga().webhook_timeout_s * 2 + 30)
    sending = list(
        Notification.objects.filter(status=Notification.Status.SENDING, lease_expires_at__lt=now)
        .order_by("lease_expires_at")
        .values_list("pk", "job_id", "updated_at", "attempts", "max_attempts")[:NOTIFICATION_BATCH]
    )
    # A sending row out of attempts whose worker died will not be claimed again: it failed.
    spent = [pk for pk, _job, _at, attempts, most in sending if attempts >= most]
    if spent:
        report.given_up = compare_and_set_rows(
            Notification.objects.filter(pk__in=spent, lease_expires_at__lt=now),
            table=NOTIFICATION_TRANSITIONS,
            to=Notification.Status.FAILED,
            allowed_from=[Notification.Status.SENDING],
            updates={
                "lease_expires_at": None,
                "last_error": "The worker sending it was lost, and no attempts are left.",
                "updated_at": now,
            },
        )
        for pk in spent:
            log.error(
                "notifications.given_up",
                notification_id=pk,
                attempt=next(a for p, _j, _u, a, _m in sending if p == pk),
                reason="The worker sending it was lost, and no attempts are left.",
            )
    due = list(notifications_pending_due(now=now, after=_notification_cursor.get("pending")))
    if len(due) < NOTIFICATION_BATCH:
        _notification_cursor.pop("pending", None)
    else:
        _notification_cursor["pending"] = (due[-1][3], due[-1][0])
    rows = [(pk, job_id, at) for pk, job_id, at, _due in due] + [
        (pk, job_id, at) for pk, job_id, at, attempts, most in sending if attempts < most
    ]
    report.read = len(due) + len(sending)
    states = queueing.job_states([job_id for _pk, job_id, _at in rows], queue="notifications")
    if states is None:
        return report  # Redis is down: the next sweep tries again
    lost = _notifications_lost(rows, states, now=now, stale_s=stale_s)
    # Handed back together: one Redis round trip and one UPDATE for the batch, not two per row
    # (after Redis restarted empty, every row of every pass is one of these).
    job_ids = queueing.enqueue_many(
        "recovery.jobs.notification_deliver",
        queue="notifications",
        kwargs_list=[{"notification_id": pk} for pk in lost],
    )
    if job_ids:
        Notification.objects.bulk_update(
            [Notification(pk=pk, job_id=job_id) for pk, job_id in zip(lost, job_ids, strict=True)],
            ["job_id"],
        )
        report.reenqueued = len(job_ids)
    for approval_id in approval_deadlines.approvals_due_for_reminder(now=now, limit=NOTIFICATION_BATCH):
        if approval_deadlines.approval_remind(approval_id=approval_id, now=now) is not None:
            report.reminders += 1
    return report
