"""The worker's part of a bulk decision by filter (``recovery.actions.bulk_filter`` starts it).

A bulk runs in ``lanes``: up to ``SAGA_BULK_LANES`` chains of jobs, each deciding a chunk then
queueing its successor at the back of the queue, so N workers decide one bulk N items at a time.
The lanes share no lock. Each chunk:

- re-checks the starter's authority (``authority_lost``: an active user who still operates the
  tenant, or a key not revoked that still holds the ``operator`` scope); a starter who lost it
  stops the bulk (``aborted``, ``abort_code`` ``authority_lost``, audited, with why);
- claims the next pending items with a lease (``claimed_by``, ``claimed_until``, ``SAGA_BULK_LEASE_S``; ``FOR UPDATE SKIP
  LOCKED``, so two lanes never claim the same item, and an item whose lease ran out, its worker
  killed, is claimed again by whichever lane comes next);
- decides each claimed item in its own transaction through the ordinary decision service, the
  item's outcome written in that transaction and only while its claim is still this lane's, so no
  item is ever decided twice; the operation's row is only read there ``FOR KEY SHARE`` (lanes do
  not wait for each other; an abort's ``FOR UPDATE`` waits for the items under way, and no item
  starts after it);
- then counts the outcomes into the operation's counters (``tally``), once per chunk rather than
  once per item (the hot row every lane would otherwise queue on).

Every item refused or failed is one structured log event at WARNING (ERROR for the unexpected),
naming the bulk, the run, the item and the reason.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from infra import errors
from infra.conf import saga
from ledger.audit import Actor, audit_context, audit_record
from ledger.models import AgentKey, Membership
from ledger.transitions import compare_and_set, compare_and_set_rows
from recovery import decisions, queueing
from recovery.actions.cancellations import run_cancel
from recovery.actions.compensations import unwind_start
from recovery.actions.resolutions import item_close, item_resume
from recovery.bulk.models import BULK_ITEM_OUTCOMES, BULK_TRANSITIONS, ERRORS_KEPT, BulkItem, BulkOperation
from recovery.models import RecoveryItem

log = structlog.get_logger(__name__)

QUEUE = "default"
# One job decides at most this many items, or for about this long, then queues its successor at
# the back of the queue, so other operators' jobs run in between.
CHUNK_ITEMS = 50
CHUNK_SECONDS = 2.0
# A lane with nothing to claim while other lanes' claims are still out looks again this much later.
WAIT_S = 2.0
# A skipped item's code on its BulkItem row (not an API error: the API counts skipped items).
CHANGED = "changed"
# ``abort_code`` of a bulk its starter no longer had the right to carry on.
AUTHORITY_LOST = "authority_lost"
# The roles that operate a tenant (dashboard.permissions: the OPERATE capability).
OPERATING_ROLES = (Membership.Role.OPERATOR, Membership.Role.ADMIN)
BULK = Actor.system("bulk")


class Lane(enum.Enum):
    """What a lane's job does after its chunk."""

    DONE = "done"  # the bulk is no longer running, or nothing is left to decide
    MORE = "more"  # items are left: the successor at the back of the queue
    WAIT = "wait"  # the items left are other lanes' claims: look again in WAIT_S


def record(bulk: BulkOperation, *, actor: Actor, kind: str, reason: str, to_state: str, **data: Any) -> None:
    audit_record(
        tenant=bulk.tenant,
        actor=actor,
        kind=kind,
        subject=bulk,
        from_state=BulkOperation.Status.RUNNING if kind != "bulk.started" else "",
        to_state=to_state,
        reason=reason,
        data={"bulk_id": bulk.pk, "action": bulk.action, **data},
    )


def enqueue(bulk_id: str, job_id: str, *, delay_s: float | None = None) -> None:
    queueing.enqueue(
        "recovery.jobs.bulk_advance",
        queue=QUEUE,
        job_id=job_id,
        delay_s=delay_s,
        bulk_id=bulk_id,
        job_timeout=300,
    )


def lanes_for(total: int) -> int:
    """How many lanes a bulk of ``total`` items runs in: ``SAGA_BULK_LANES``, no more than it has
    chunks."""
    return max(1, min(saga().bulk_lanes, -(-total // CHUNK_ITEMS)))


# --- Authority -----------------------------------------------------------------------------------


def _actor_of(bulk: BulkOperation) -> Actor | None:
    if bulk.requested_by is not None:
        return Actor.for_user(bulk.requested_by)
    if bulk.requested_by_key is not None:
        return Actor.for_key(bulk.requested_by_key)
    return None


def authority_lost(bulk: BulkOperation) -> str:
    """Why the bulk's starter may no longer decide in its tenant ("" when they still may), read
    fresh from the database: the user deactivated or no longer an operator or admin of the
    tenant; the key revoked, or without the ``operator`` scope; either deleted."""
    if bulk.requested_by_id is not None:
        user = get_user_model().objects.filter(pk=bulk.requested_by_id).first()
        if user is None:
            return f"{bulk.requested_by_label} no longer exists."
        if not user.is_active:
            return f"{bulk.requested_by_label} was deactivated."
        if not Membership.objects.filter(
            user_id=user.pk, tenant_id=bulk.tenant_id, role__in=OPERATING_ROLES
        ).exists():
            return f"{bulk.requested_by_label} is no longer an operator of this tenant."
        return ""
    if bulk.requested_by_key_id is not None:
        key = AgentKey.objects.filter(pk=bulk.requested_by_key_id).first()
        if key is None:
            return f"{bulk.requested_by_label} no longer exists."
        if not key.is_active:
            return f"{bulk.requested_by_label} was revoked."
        if key.tenant_id != bulk.tenant_id or AgentKey.Scope.OPERATOR not in key.scopes:
            return f"{bulk.requested_by_label} no longer holds the operator scope."
        return ""
    return "The operator who started it no longer exists."


def _stop(bulk: BulkOperation, why: str) -> None:
    """The bulk stopped because its starter lost the right to carry it on: ``aborted`` with
    ``abort_code`` ``authority_lost``, audited ``bulk.aborted`` by the system, logged."""
    message = f"Stopped: {why} The decisions already made stand; start it again as someone who may."
    with transaction.atomic():
        locked = BulkOperation.objects.select_for_update().select_related("tenant").get(pk=bulk.pk)
        if locked.status != BulkOperation.Status.RUNNING:
            return
        bulk_aborted(
            locked,
            actor=BULK,
            reason=message,
            code=AUTHORITY_LOST,
            cause=AUTHORITY_LOST,
            requested_by=locked.requested_by_label,
        )
    log.warning(
        "bulk.stopped",
        bulk_id=bulk.pk,
        tenant=bulk.tenant.slug,
        reason=AUTHORITY_LOST,
        requested_by=bulk.requested_by_label,
        message=why,
    )


def bulk_aborted(locked: BulkOperation, *, actor: Actor, reason: str, code: str = "", **data: Any) -> None:
    """running → aborted, under the bulk's row lock (the caller's, which read it running): its
    counters made exact at the abort (the lanes count theirs per chunk), its unstarted items'
    claims released, audited ``bulk.aborted`` with the counts (and ``data``). The one way a bulk
    is aborted: by an operator (``bulk_filter.bulk_abort``) or because its starter lost the right
    (``_stop``)."""
    tally(locked.pk)
    locked.refresh_from_db()
    now = timezone.now()
    compare_and_set(
        locked,
        table=BULK_TRANSITIONS,
        to=BulkOperation.Status.ABORTED,
        current=locked.status,
        updates={
            "abort_reason": reason,
            "abort_code": code,
            "aborted_by_label": actor.label[:200],
            "finished_at": now,
            "updated_at": now,
        },
    )
    BulkItem.objects.filter(bulk_id=locked.pk, outcome=BulkItem.Outcome.PENDING).update(
        claimed_by="", claimed_until=None
    )
    record(
        locked,
        actor=actor,
        kind="bulk.aborted",
        reason=reason,
        to_state=BulkOperation.Status.ABORTED,
        **data,
        done=locked.done,
        failed=locked.failed,
        skipped=locked.skipped,
        left=locked.total - locked.decided,
    )


# --- Claims, decisions, counters ------------------------------------------------------------------


def _claim(bulk_id: str, claimer: str, *, count: int, now: datetime) -> list[BulkItem]:
    """Up to ``count`` of the bulk's pending items, in order, not claimed by a live lease,
    claimed for ``claimer`` in one statement."""
    # Longer than a chunk takes (SAGA_BULK_LEASE_S, 30 s), so a live lane keeps its items; a
    # killed lane's are claimed again once it runs out.
    until = now + timedelta(seconds=max(saga().bulk_lease_s, 2 * CHUNK_SECONDS))
    with transaction.atomic():
        ids = list(
            BulkItem.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(bulk_id=bulk_id, outcome=BulkItem.Outcome.PENDING)
            .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
            .order_by("position")
            .values_list("pk", flat=True)[:count]
        )
        BulkItem.objects.filter(pk__in=ids).update(claimed_by=claimer, claimed_until=until)
    return list(BulkItem.objects.filter(pk__in=ids).order_by("position"))


def _release(claimer: str, rows: list[BulkItem]) -> None:
    """Give back the claims a lane will not decide (its chunk's time is up)."""
    BulkItem.objects.filter(
        pk__in=[row.pk for row in rows], claimed_by=claimer, outcome=BulkItem.Outcome.PENDING
    ).update(claimed_by="", claimed_until=None)


def _decision(action: str) -> Callable[[RecoveryItem, Actor, str], object]:
    if action == BulkOperation.Action.COMPENSATE:
        return lambda item, actor, reason: unwind_start(item=item, actor=actor, reason=reason)
    if action == BulkOperation.Action.CLOSE:
        return lambda item, actor, reason: item_close(item=item, actor=actor, reason=reason)
    if action == BulkOperation.Action.RESUME:
        return lambda item, actor, reason: item_resume(item=item, actor=actor, reason=reason)
    return lambda item, actor, reason: run_cancel(run=item.run, actor=actor, reason=reason)


def _changed(item: RecoveryItem, row: BulkItem) -> str:
    """Why the item is no longer what the bulk matched ("" when it is)."""
    if item.status != row.seen_status:
        return f"It is {item.status} now (it was {row.seen_status} when the bulk started): someone decided it meanwhile."
    if item.updated_at != row.seen_updated_at:
        return "It changed after the bulk started (a new failure, an assignment or another decision)."
    return ""


def _settle(row: BulkItem, *, outcome: str, code: str = "", message: str = "") -> None:
    """Write the item's outcome (in the item's transaction, under its row lock, read pending
    there; the counters follow per chunk)."""
    compare_and_set_rows(
        BulkItem.objects.filter(pk=row.pk),
        table=BULK_ITEM_OUTCOMES,
        to=outcome,
        column="outcome",
        updates={
            "code": code,
            "message": message[:2000],
            "decided_at": timezone.now(),
            "claimed_until": None,
        },
    )


def _still_running(bulk_id: str) -> bool:
    """The operation's status under ``FOR KEY SHARE``: lanes share it; an abort (``FOR UPDATE``)
    waits for this item's transaction, and every item after the abort sees it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT status FROM bulk_bulkoperation WHERE id = %s FOR KEY SHARE", [bulk_id])
        found = cursor.fetchone()
    return found is not None and found[0] == BulkOperation.Status.RUNNING


def _decide_one(bulk: BulkOperation, row: BulkItem, *, claimer: str, actor: Actor) -> bool:
    """Decide one claimed item in its own transaction; False when the bulk is no longer running."""
    with transaction.atomic():
        if not _still_running(bulk.pk):
            return False
        # Only the item's row (its default ordering joins the operation, which FOR UPDATE would
        # lock too: every lane queued on it again).
        mine = (
            BulkItem.objects.select_for_update(of=("self",))
            .filter(pk=row.pk, claimed_by=claimer, outcome=BulkItem.Outcome.PENDING)
            .order_by()
            .first()
        )
        if mine is None:
            return True  # its lease ran out and another lane took it (and decides it)
        # The item before its run, as every decision takes them (no deadlock with a person's).
        item = (
            RecoveryItem.objects.select_for_update(of=("self",))
            .select_related("run__tenant")
            .get(pk=mine.item_id)
        )
        why = _changed(item, mine)
        if why:
            _settle(mine, outcome=BulkItem.Outcome.SKIPPED, code=CHANGED, message=why)
            return True
        try:
            with audit_context(bulk_id=bulk.pk):
                _decision(bulk.action)(item, actor, bulk.reason)
        except errors.SagaError as exc:
            # The decision's own savepoint rolled back; its refusal is audited (with the bulk id).
            sentence = decisions.refusal_sentence(exc)
            _settle(mine, outcome=BulkItem.Outcome.FAILED, code=exc.code, message=sentence)
            log.warning(
                "bulk.item_failed",
                bulk_id=bulk.pk,
                run=mine.run_id,
                item=mine.item_id,
                reason=exc.code,
                message=sentence[:500],
            )
            return True
        _settle(mine, outcome=BulkItem.Outcome.DONE)
        return True


def _fail_stuck_item(bulk_id: str, row: BulkItem, exc: Exception) -> None:
    """An item whose decision raised something unexpected is counted failed (in a transaction of
    its own, the decision's rolled back), so one bad item cannot stall the bulk."""
    log.error(
        "bulk.item_error",
        bulk_id=bulk_id,
        run=row.run_id,
        item=row.item_id,
        reason="internal_error",
        error=f"{type(exc).__name__}: {exc}"[:500],
        exc_info=exc,
    )
    with transaction.atomic():
        compare_and_set_rows(
            BulkItem.objects.filter(pk=row.pk),
            table=BULK_ITEM_OUTCOMES,
            to=BulkItem.Outcome.FAILED,
            column="outcome",
            updates={
                "code": "internal_error",
                "message": str(exc)[:300],
                "decided_at": timezone.now(),
                "claimed_until": None,
            },
        )


def tally(bulk_id: str) -> None:
    """The operation's counters and first errors, counted from its items' outcome rows (exact
    whatever the lanes did, and whichever of them crashed)."""
    counts = dict(
        BulkItem.objects.filter(bulk_id=bulk_id)
        .exclude(outcome=BulkItem.Outcome.PENDING)
        .order_by()
        .values_list("outcome")
        .annotate(n=Count("id"))
        .values_list("outcome", "n")
    )
    failed = (
        BulkItem.objects.filter(bulk_id=bulk_id, outcome=BulkItem.Outcome.FAILED)
        .order_by("position")
        .values("item_id", "run_id", "code", "message")[:ERRORS_KEPT]
    )
    BulkOperation.objects.filter(pk=bulk_id).update(
        done=counts.get(BulkItem.Outcome.DONE, 0),
        failed=counts.get(BulkItem.Outcome.FAILED, 0),
        skipped=counts.get(BulkItem.Outcome.SKIPPED, 0),
        errors=[{**each, "message": each["message"][:500]} for each in failed],
        updated_at=timezone.now(),
    )


def _finish(bulk_id: str) -> None:
    with transaction.atomic():
        bulk = (
            BulkOperation.objects.select_for_update()
            .select_related("tenant")
            .filter(pk=bulk_id, status=BulkOperation.Status.RUNNING)
            .first()
        )
        if (
            bulk is None
            or BulkItem.objects.filter(bulk_id=bulk_id, outcome=BulkItem.Outcome.PENDING).exists()
        ):
            return
        tally(bulk_id)
        now = timezone.now()
        # Under the row lock, read running there.
        compare_and_set(
            bulk,
            table=BULK_TRANSITIONS,
            to=BulkOperation.Status.FINISHED,
            current=bulk.status,
            updates={"finished_at": now, "updated_at": now},
        )
        bulk.refresh_from_db()
        record(
            bulk,
            actor=BULK,
            kind="bulk.finished",
            reason=bulk.reason,
            to_state=BulkOperation.Status.FINISHED,
            done=bulk.done,
            failed=bulk.failed,
            skipped=bulk.skipped,
        )


# --- A lane's chunk --------------------------------------------------------------------------------


def bulk_advance(
    *, bulk_id: str, max_items: int = CHUNK_ITEMS, budget_s: float = CHUNK_SECONDS, claimer: str = ""
) -> Lane:
    """One chunk of one lane: the starter's authority checked, up to ``max_items`` items claimed
    and decided (for about ``budget_s``), the counters brought up to date."""
    claimer = claimer or uuid.uuid4().hex
    deadline = time.monotonic() + budget_s
    bulk = (
        BulkOperation.objects.select_related("tenant", "requested_by", "requested_by_key")
        .filter(pk=bulk_id, status=BulkOperation.Status.RUNNING)
        .first()
    )
    if bulk is None:
        return Lane.DONE
    why = authority_lost(bulk)
    actor = _actor_of(bulk)
    if why or actor is None:
        _stop(bulk, why or "The operator who started it no longer exists.")
        return Lane.DONE
    rows = _claim(bulk_id, claimer, count=max_items, now=timezone.now())
    if not rows:
        if not BulkItem.objects.filter(bulk_id=bulk_id, outcome=BulkItem.Outcome.PENDING).exists():
            _finish(bulk_id)
            return Lane.DONE
        return Lane.WAIT
    for n, row in enumerate(rows):
        try:
            if not _decide_one(bulk, row, claimer=claimer, actor=actor):
                _release(claimer, rows[n:])
                break
        except Exception as exc:  # noqa: BLE001 - counted against the item, logged; the bulk goes on
            _fail_stuck_item(bulk_id, row, exc)
        if time.monotonic() > deadline:
            _release(claimer, rows[n + 1 :])
            break
    tally(bulk_id)
    if not BulkItem.objects.filter(bulk_id=bulk_id, outcome=BulkItem.Outcome.PENDING).exists():
        _finish(bulk_id)
        return Lane.DONE
    running = BulkOperation.objects.filter(pk=bulk_id, status=BulkOperation.Status.RUNNING).exists()
    return Lane.MORE if running else Lane.DONE


def bulk_advance_chunk(
    *, bulk_id: str, max_items: int = CHUNK_ITEMS, budget_s: float = CHUNK_SECONDS
) -> bool:
    """A chunk, as one lane; True when items are left for a next one."""
    return bulk_advance(bulk_id=bulk_id, max_items=max_items, budget_s=budget_s) is not Lane.DONE


# --- Jobs: hand-over and the sweep -----------------------------------------------------------------


def bulk_hand_over(*, bulk_id: str, from_job: str, delay_s: float | None = None) -> str | None:
    """Queue the lane's next chunk at the back of the queue (``delay_s`` later, if given), if
    ``from_job`` still carries that lane (a sweep may have handed it to another job, which then
    goes on alone). The job id is recorded before the enqueue: a lost enqueue is the sweep's to
    repair."""
    job_id = queueing.new_job_id()
    with transaction.atomic():
        bulk = (
            BulkOperation.objects.select_for_update(no_key=True)
            .filter(pk=bulk_id, status=BulkOperation.Status.RUNNING)
            .first()
        )
        if bulk is None:
            return None
        jobs = list(bulk.jobs or [bulk.job_id])
        if from_job not in jobs:
            return None
        jobs[jobs.index(from_job)] = job_id
        BulkOperation.objects.filter(pk=bulk_id).update(jobs=jobs, job_id=jobs[0], updated_at=timezone.now())
    enqueue(bulk_id, job_id, delay_s=delay_s)
    return job_id


def bulks_sweep(*, now: datetime | None = None) -> int:
    """Hand each lane of a running bulk that has not moved for a while, and whose job will not run
    (Redis lost it, its worker was SIGKILLed), to a new job. Returns how many lanes."""
    now = now or timezone.now()
    interval = saga().sweep_interval_s
    idle = max(3 * interval, 2 * CHUNK_SECONDS)
    handed = 0
    stale = BulkOperation.objects.filter(
        Q(status=BulkOperation.Status.RUNNING), updated_at__lt=now - timedelta(seconds=idle)
    ).values_list("pk", "job_id", "jobs")
    for bulk_id, job_id, jobs in stale:
        for lane_job in list(jobs or [job_id]):
            will_run = queueing.job_will_run(
                lane_job, queue=QUEUE, started_within_s=max(3 * interval, 3 * CHUNK_SECONDS)
            )
            if will_run is None:
                return handed  # Redis is down: the next sweep looks again
            if will_run:
                continue
            if bulk_hand_over(bulk_id=bulk_id, from_job=lane_job):
                handed += 1
                log.info("bulk.reenqueued", bulk_id=bulk_id, previous_job=lane_job)
    return handed
