"""Bulk decisions by filter: one operator's decision (compensate, close, resume, cancel) over every
item a queue filter matches, for the day hundreds of runs fail the same way.

- ``bulk_preview``: what the filter matches now (counts by risk and reason, a sample, how many
  compensations would wait for an approver); nothing changes.
- ``bulk_start``: refuses an empty filter (``filter_required``) and a count other than the one
  the operator confirmed (``count_changed``), then snapshots the matching items (their status and
  ``updated_at``) and hands the operation to a worker.
- ``bulk_advance_chunk``: what the worker does, a chunk at a time: each item decided in its own
  short transaction by the ordinary decision service (``unwind_start``, ``item_close``,
  ``item_resume``, ``run_cancel``: the same planner, policies and approvals; a step that needs a
  person still waits for one, and the self-approval rule holds against the requesting operator),
  with that operator as actor and the bulk's id in every audit event. The item's outcome row is
  written in the same transaction, so a worker killed mid-bulk resumes where it stopped and never
  decides an item twice. An item that changed since the snapshot is skipped, never forced.
- ``bulk_abort``: no further item is started; the decisions made stand.
- ``bulks_sweep``: the periodic safety net that hands a running bulk whose job was lost to a
  worker again.

The ticked bulk of at most ``SAGA_BULK_MAX_ITEMS`` low-risk items (``recovery.services.bulk``) is
another, older path and stays as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import transaction
from django.db.models import Count, F, QuerySet
from django.utils import timezone

from ledger import errors
from ledger.audit import Actor, audit_context, audit_record
from ledger.conf import saga
from ledger.models import Action, Tenant
from ledger.rules import reason_required
from recovery import decisions, queueing
from recovery.bulk.models import ERRORS_KEPT, BulkItem, BulkOperation
from recovery.models import RecoveryItem
from recovery.planner import runs_needing_approval
from recovery.selectors import QueueFilter
from recovery.services.cancelling import run_cancel
from recovery.services.compensating import unwind_start
from recovery.services.resolving import item_close, item_resume

log = structlog.get_logger(__name__)

QUEUE = "default"
SAMPLE_SIZE = 10
# The most items one bulk takes: past it, narrow the filter (the snapshot is written in one
# statement at the start, and a longer one would hold that transaction too long).
MAX_ITEMS = 50_000
# One job decides at most this many items, or for about this long, then queues its successor at
# the back of the queue, so other operators' jobs run in between.
CHUNK_ITEMS = 50
CHUNK_SECONDS = 2.0

ACTIONS = tuple(BulkOperation.Action.values)
# A skipped item's code on its BulkItem row (not an API error: the API counts skipped items).
CHANGED = "changed"


class FilterRequired(errors.ValidationFailed):
    code = "filter_required"


class CountChanged(errors.Conflict):
    code = "count_changed"


def _check_action(action: str) -> str:
    if action not in ACTIONS:
        raise errors.ValidationFailed(
            f"Unknown action {str(action)[:40]!r}: one of {', '.join(ACTIONS)}.",
            details={"action": str(action)[:40], "allowed": list(ACTIONS)},
        )
    return action


def _check_filter(queue_filter: QueueFilter) -> QueueFilter:
    if queue_filter.is_empty():
        raise FilterRequired(
            "A bulk decision needs a filter that narrows the queue (a reason, risk, age, agent, tool "
            "or search): it is never a decision about everything.",
            details={"filter": queue_filter.as_dict()},
        )
    return queue_filter


def filter_from_dict(data: dict[str, Any]) -> QueueFilter:
    """The filter a bulk was started with (``QueueFilter.as_dict``), for showing it again."""
    older = data.get("older_than_s")
    return QueueFilter(
        status=data.get("status") or "unresolved",
        reason=data.get("reason") or "",
        risk=data.get("risk") or "",
        older_than=timedelta(seconds=older) if older is not None else None,
        run_id=data.get("run_id") or "",
        tenant_slug=data.get("tenant_slug") or "",
        signature=data.get("signature") or "",
        search=data.get("search") or "",
        agent=data.get("agent") or "",
        tool=data.get("tool") or "",
    )


# --- Preview -----------------------------------------------------------------------------------


@dataclass
class BulkPreview:
    count: int
    by_risk: dict[str, int]
    by_reason: dict[str, int]
    sample: list[RecoveryItem]
    needs_approval: int
    action: str = ""
    filter: dict[str, Any] = field(default_factory=dict)


def _matching(*, tenant: Tenant, queue_filter: QueueFilter) -> QuerySet[RecoveryItem]:
    return queue_filter.items(tenants=tenant)


def bulk_preview(*, tenant: Tenant, queue_filter: QueueFilter, action: str) -> BulkPreview:
    """What a bulk ``action`` over ``queue_filter`` would take on now. ``needs_approval``: of the
    items, how many runs' compensation has a step an approver must grant (by the planner's own
    rule, ``recovery.planner.runs_needing_approval``); 0 for the other actions, which need none."""
    _check_action(action)
    _check_filter(queue_filter)
    matching = _matching(tenant=tenant, queue_filter=queue_filter)
    by_risk = dict(matching.order_by().values_list("risk").annotate(n=Count("id")).values_list("risk", "n"))
    by_reason = dict(
        matching.order_by().values_list("reason").annotate(n=Count("id")).values_list("reason", "n")
    )
    sample = list(
        matching.select_related("run", "failed_action", "assignee", "claimed_by").order_by("-id")[
            :SAMPLE_SIZE
        ]
    )
    needs_approval = 0
    if action == BulkOperation.Action.COMPENSATE and by_risk:
        actions = Action.objects.filter(run_id__in=matching.order_by().values("run_id")).select_related(
            "run__tenant"
        )
        needs_approval = len(runs_needing_approval(actions.iterator(chunk_size=2000)))
    return BulkPreview(
        count=sum(by_risk.values()),
        by_risk=by_risk,
        by_reason=by_reason,
        sample=sample,
        needs_approval=needs_approval,
        action=action,
        filter=queue_filter.as_dict(),
    )


# --- Start, abort ------------------------------------------------------------------------------


def _record(bulk: BulkOperation, *, actor: Actor, kind: str, reason: str, to_state: str, **data: Any) -> None:
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


def _enqueue(bulk_id: str, job_id: str) -> None:
    queueing.enqueue(
        "recovery.jobs.bulk_advance", queue=QUEUE, job_id=job_id, bulk_id=bulk_id, job_timeout=300
    )


def bulk_start(
    *,
    tenant: Tenant,
    queue_filter: QueueFilter,
    action: str,
    reason: str,
    actor: Actor,
    expected_count: int,
) -> BulkOperation:
    """Start deciding ``action`` for every item ``queue_filter`` matches in ``tenant``, as
    ``actor``. ``expected_count``: how many the operator saw in the preview; another count now is
    409 ``count_changed`` and nothing starts. The matching items are snapshotted now; the worker
    decides each of them later, skipping those that changed in between."""
    reason = reason_required(reason)
    _check_action(action)
    _check_filter(queue_filter)
    if isinstance(expected_count, bool) or not isinstance(expected_count, int) or expected_count < 0:
        raise errors.ValidationFailed(
            "expected_count must be a whole number.", details={"expected_count": "invalid"}
        )
    with transaction.atomic():
        rows = list(
            _matching(tenant=tenant, queue_filter=queue_filter)
            .order_by("opened_at", "id")
            .values_list("pk", "run_id", "status", "updated_at")[: MAX_ITEMS + 1]
        )
        if len(rows) > MAX_ITEMS:
            raise errors.ValidationFailed(
                f"The filter matches more than {MAX_ITEMS} items; narrow it and decide them in parts.",
                details={"max_items": MAX_ITEMS},
                code="too_many_items",
            )
        if len(rows) != expected_count:
            raise CountChanged(
                f"The filter matches {len(rows)} items now, not the {expected_count} you confirmed: "
                "preview again. Nothing was started.",
                details={"count": len(rows), "expected_count": expected_count},
            )
        job_id = queueing.new_job_id()
        bulk = BulkOperation.objects.create(
            tenant=tenant,
            action=action,
            filter=queue_filter.as_dict(),
            reason=reason,
            requested_by=actor.user,
            requested_by_key=actor.key,
            requested_by_label=actor.label[:200],
            total=len(rows),
            job_id=job_id,
            # Nothing to decide is finished at once.
            status=BulkOperation.Status.RUNNING if rows else BulkOperation.Status.FINISHED,
            finished_at=None if rows else timezone.now(),
        )
        BulkItem.objects.bulk_create(
            [
                BulkItem(
                    bulk=bulk, item_id=pk, run_id=run_id, position=n, seen_status=status, seen_updated_at=at
                )
                for n, (pk, run_id, status, at) in enumerate(rows)
            ],
            batch_size=2000,
        )
        _record(
            bulk,
            actor=actor,
            kind="bulk.started",
            reason=reason,
            to_state=bulk.status,
            total=bulk.total,
            filter=bulk.filter,
        )
        if rows:
            transaction.on_commit(lambda: _enqueue(bulk.pk, job_id))
    return bulk


def bulk_abort(*, bulk: BulkOperation, actor: Actor, reason: str) -> BulkOperation:
    """Stop a running bulk: no further item is started (the worker checks under the operation's
    row lock before each item); what was decided stands. A bulk that is not running is 409."""
    reason = reason_required(reason)
    with transaction.atomic():
        locked = BulkOperation.objects.select_for_update().select_related("tenant").get(pk=bulk.pk)
        if locked.status != BulkOperation.Status.RUNNING:
            raise errors.InvalidTransition(
                locked,
                to=BulkOperation.Status.ABORTED,
                message=f"Bulk {locked.pk} is {locked.status}; only a running bulk can be aborted.",
            )
        now = timezone.now()
        BulkOperation.objects.filter(pk=locked.pk).update(
            status=BulkOperation.Status.ABORTED,
            abort_reason=reason,
            aborted_by_label=actor.label[:200],
            finished_at=now,
            updated_at=now,
        )
        _record(
            locked,
            actor=actor,
            kind="bulk.aborted",
            reason=reason,
            to_state=BulkOperation.Status.ABORTED,
            done=locked.done,
            failed=locked.failed,
            skipped=locked.skipped,
            left=locked.total - locked.decided,
        )
    locked.refresh_from_db()
    return locked


# --- The worker's part ---------------------------------------------------------------------------


def _actor_of(bulk: BulkOperation) -> Actor | None:
    if bulk.requested_by is not None:
        return Actor.for_user(bulk.requested_by)
    if bulk.requested_by_key is not None:
        return Actor.for_key(bulk.requested_by_key)
    return None


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


def _settle(bulk: BulkOperation, row: BulkItem, *, outcome: str, code: str = "", message: str = "") -> None:
    """Write the item's outcome and the operation's counters (in the item's transaction)."""
    now = timezone.now()
    BulkItem.objects.filter(pk=row.pk).update(
        outcome=outcome, code=code, message=message[:2000], decided_at=now
    )
    counter = {
        BulkItem.Outcome.DONE: "done",
        BulkItem.Outcome.FAILED: "failed",
        BulkItem.Outcome.SKIPPED: "skipped",
    }[BulkItem.Outcome(outcome)]
    updates: dict[str, Any] = {counter: F(counter) + 1, "updated_at": now}
    if outcome == BulkItem.Outcome.FAILED:
        # One structured event per item a bulk could not decide (docs/OPERATIONS.md, "What went
        # wrong, in the logs"); the operation keeps the first few for its page.
        log.warning(
            "bulk.item_failed",
            bulk_id=bulk.pk,
            action=bulk.action,
            item_id=row.item_id,
            run_id=row.run_id,
            step_id=None,
            tool=None,
            attempt=None,
            code=code,
            reason=message[:500],
        )
    if outcome == BulkItem.Outcome.FAILED and len(bulk.errors) < ERRORS_KEPT:
        updates["errors"] = [
            *bulk.errors,
            {"item_id": row.item_id, "run_id": row.run_id, "code": code, "message": message[:500]},
        ]
    BulkOperation.objects.filter(pk=bulk.pk).update(**updates)


def _finish(bulk: BulkOperation) -> None:
    now = timezone.now()
    BulkOperation.objects.filter(pk=bulk.pk, status=BulkOperation.Status.RUNNING).update(
        status=BulkOperation.Status.FINISHED, finished_at=now, updated_at=now
    )
    bulk.refresh_from_db()
    _record(
        bulk,
        actor=Actor.system("bulk"),
        kind="bulk.finished",
        reason=bulk.reason,
        to_state=BulkOperation.Status.FINISHED,
        done=bulk.done,
        failed=bulk.failed,
        skipped=bulk.skipped,
    )


def _advance_one(bulk_id: str) -> bool:
    """Decide the bulk's next pending item in one transaction; False when nothing is left to start
    (finished, aborted, or every item decided)."""
    with transaction.atomic():
        # The operation's row lock: an abort either happened before (nothing more starts) or waits
        # for this item; and two jobs of one bulk (a sweep that judged a slow job lost) take turns.
        bulk = (
            BulkOperation.objects.select_for_update(of=("self",))
            .select_related("tenant", "requested_by", "requested_by_key")
            .filter(pk=bulk_id)
            .first()
        )
        if bulk is None or bulk.status != BulkOperation.Status.RUNNING:
            return False
        row = (
            BulkItem.objects.filter(bulk_id=bulk.pk, outcome=BulkItem.Outcome.PENDING)
            .order_by("position")
            .first()
        )
        if row is None:
            _finish(bulk)
            return False
        actor = _actor_of(bulk)
        if actor is None:
            BulkOperation.objects.filter(pk=bulk.pk).update(
                status=BulkOperation.Status.ABORTED,
                abort_reason="The operator who started it no longer exists.",
                finished_at=timezone.now(),
            )
            return False
        # The item before its run, as every decision takes them (no deadlock with a person's).
        item = (
            RecoveryItem.objects.select_for_update(of=("self",))
            .select_related("run__tenant")
            .get(pk=row.item_id)
        )
        why = _changed(item, row)
        if why:
            _settle(bulk, row, outcome=BulkItem.Outcome.SKIPPED, code=CHANGED, message=why)
            return True
        try:
            with audit_context(bulk_id=bulk.pk):
                _decision(bulk.action)(item, actor, bulk.reason)
        except errors.SagaError as exc:
            # The decision's own savepoint rolled back; its refusal is audited (with the bulk id).
            _settle(
                bulk,
                row,
                outcome=BulkItem.Outcome.FAILED,
                code=exc.code,
                message=decisions.refusal_sentence(exc),
            )
            return True
        _settle(bulk, row, outcome=BulkItem.Outcome.DONE)
        return True


def _fail_stuck_item(bulk_id: str, exc: Exception) -> None:
    """An item whose decision raised something unexpected is counted failed (in a transaction of
    its own, the decision's rolled back), so one bad item cannot stall the bulk."""
    with transaction.atomic():
        bulk = (
            BulkOperation.objects.select_for_update()
            .filter(pk=bulk_id, status=BulkOperation.Status.RUNNING)
            .first()
        )
        if bulk is None:
            return
        row = (
            BulkItem.objects.filter(bulk_id=bulk_id, outcome=BulkItem.Outcome.PENDING)
            .order_by("position")
            .first()
        )
        if row is not None:
            _settle(bulk, row, outcome=BulkItem.Outcome.FAILED, code="internal_error", message=str(exc)[:300])


def bulk_advance_chunk(
    *, bulk_id: str, max_items: int = CHUNK_ITEMS, budget_s: float = CHUNK_SECONDS
) -> bool:
    """Decide up to ``max_items`` items (or for about ``budget_s``), each in its own transaction.
    True when items are left for a next chunk."""
    deadline = time.monotonic() + budget_s
    for _ in range(max_items):
        try:
            if not _advance_one(bulk_id):
                return False
        except errors.SagaError:
            raise
        except Exception as exc:  # noqa: BLE001 - counted against the item, logged; the bulk goes on
            log.exception("bulk.item_error", bulk_id=bulk_id)
            _fail_stuck_item(bulk_id, exc)
        if time.monotonic() > deadline:
            break
    return BulkOperation.objects.filter(pk=bulk_id, status=BulkOperation.Status.RUNNING).exists()


def bulk_hand_over(*, bulk_id: str, from_job: str) -> str | None:
    """Queue the bulk's next chunk at the back of the queue, if ``from_job`` still carries it (a
    sweep may have handed it to another job, which then goes on alone). The job id is recorded
    before the enqueue: a lost enqueue is the sweep's to repair."""
    job_id = queueing.new_job_id()
    moved = BulkOperation.objects.filter(
        pk=bulk_id, status=BulkOperation.Status.RUNNING, job_id=from_job
    ).update(job_id=job_id, updated_at=timezone.now())
    if moved != 1:
        return None
    _enqueue(bulk_id, job_id)
    return job_id


def bulks_sweep(*, now: datetime | None = None) -> int:
    """Hand each running bulk that has not moved for a while, and whose job will not run (Redis
    lost it, its worker was SIGKILLed), to a new job. Returns how many."""
    now = now or timezone.now()
    interval = saga().sweep_interval_s
    idle = max(3 * interval, 2 * CHUNK_SECONDS)
    handed = 0
    for bulk_id, job_id in BulkOperation.objects.filter(
        status=BulkOperation.Status.RUNNING, updated_at__lt=now - timedelta(seconds=idle)
    ).values_list("pk", "job_id"):
        will_run = queueing.job_will_run(
            job_id, queue=QUEUE, started_within_s=max(3 * interval, 3 * CHUNK_SECONDS)
        )
        if will_run is None:
            break  # Redis is down: the next sweep looks again
        if will_run:
            continue
        if bulk_hand_over(bulk_id=bulk_id, from_job=job_id):
            handed += 1
            log.info("bulk.reenqueued", bulk_id=bulk_id, previous_job=job_id)
    return handed
