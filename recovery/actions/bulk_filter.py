"""Bulk decisions by filter: one operator's decision (compensate, close, resume, cancel) over every
item a queue filter matches, for the day hundreds of runs fail the same way.

- ``bulk_preview``: what the filter matches now (counts by risk and reason, a sample, how many
  compensations would wait for an approver, over at most ``PREVIEW_RUNS`` runs and
  ``PREVIEW_ACTIONS`` of their actions); nothing changes. Its statements run under a
  ``PREVIEW_TIMEOUT_MS`` statement timeout: a preview that cannot finish in time is 503
  ``preview_timeout``, not a web thread held for as long as the filter takes.
- ``bulk_start``: refuses an empty filter (``filter_required``) and a count other than the one
  the operator confirmed (``count_changed``), then snapshots the matching items (their status and
  ``updated_at``) and hands the operation to a worker.
- ``bulk_advance_chunk`` (``recovery.actions.bulk_worker``): what the workers do, a chunk at a
  time in parallel lanes, each item claimed under a lease and decided in its own short
  transaction by the ordinary decision service (``unwind_start``, ``item_close``,
  ``item_resume``, ``run_cancel``: the same planner, policies and approvals; a step that needs a
  person still waits for one, and the self-approval rule holds against the requesting operator),
  with that operator as actor and the bulk's id in every audit event. The item's outcome row is
  written in the same transaction, so a worker killed mid-bulk resumes where it stopped and never
  decides an item twice. An item that changed since the snapshot is skipped, never forced. Every
  chunk re-checks that the starter may still decide: one who lost the right stops the bulk.
- ``bulk_abort``: no further item is started; the decisions made stand.
- ``bulks_sweep`` (``recovery.actions.bulk_worker``): the periodic safety net that hands a
  running bulk whose job was lost to a worker again.

The ticked bulk of at most ``SAGA_BULK_MAX_ITEMS`` low-risk items (``recovery.actions.bulk``) is
the queue page's synchronous one: its outcome per item is on the page that answers the press, which
a worker's bulk cannot give.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from django.db import OperationalError, connection, transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Tenant
from ledger.rules import reason_required
from recovery import queueing
from recovery.actions.bulk_worker import bulk_aborted, enqueue, lanes_for, record
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.models import RecoveryItem
from recovery.planner import runs_needing_approval
from recovery.selectors import QueueFilter

log = structlog.get_logger(__name__)

SAMPLE_SIZE = 10
# The most items one bulk takes: past it, narrow the filter (the snapshot is written in one
# statement at the start, and a longer one would hold that transaction too long).
MAX_ITEMS = 50_000
# The preview's needs_approval walks the actions of at most this many of the matching runs (the
# newest items' runs), and at most this many of their actions: past either it is a lower bound,
# said so (``needs_approval_capped``). It runs in the web request.
PREVIEW_RUNS = 2_000
PREVIEW_ACTIONS = 50_000
# Each of the preview's statements is cut off past this (503 preview_timeout).
PREVIEW_TIMEOUT_MS = 5_000

ACTIONS = tuple(BulkOperation.Action.values)


class PreviewTimeout(errors.ServiceUnavailable):
    code = "preview_timeout"


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
    # needs_approval counted over part of the runs only (PREVIEW_RUNS, PREVIEW_ACTIONS): a lower bound.
    needs_approval_capped: bool = False


def _matching(*, tenant: Tenant, queue_filter: QueueFilter) -> QuerySet[RecoveryItem]:
    return queue_filter.items(tenants=tenant)


def _needs_approval(matching: QuerySet[RecoveryItem]) -> tuple[int, bool]:
    """How many of the matching items' runs need an approver to compensate, over at most
    PREVIEW_RUNS runs and PREVIEW_ACTIONS actions; and whether it stopped short of all of them."""
    items = list(matching.order_by("-id").values_list("run_id", flat=True)[: PREVIEW_RUNS + 1])
    capped = len(items) > PREVIEW_RUNS
    run_ids = list(dict.fromkeys(items[:PREVIEW_RUNS]))
    actions = list(
        Action.objects.filter(run_id__in=run_ids)
        .select_related("run__tenant")
        .order_by("run_id", "pk")[: PREVIEW_ACTIONS + 1]
    )
    if len(actions) > PREVIEW_ACTIONS:
        capped = True
        actions = actions[:PREVIEW_ACTIONS]
    return len(runs_needing_approval(actions)), capped


def bulk_preview(*, tenant: Tenant, queue_filter: QueueFilter, action: str) -> BulkPreview:
    """What a bulk ``action`` over ``queue_filter`` would take on now. ``needs_approval``: of the
    items, how many runs' compensation has a step an approver must grant (by the planner's own
    rule, ``recovery.planner.runs_needing_approval``), over at most ``PREVIEW_RUNS`` runs; 0 for
    the other actions, which need none. Each statement runs under ``PREVIEW_TIMEOUT_MS``:
    ``PreviewTimeout`` (503) past it."""
    _check_action(action)
    _check_filter(queue_filter)
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL statement_timeout = {int(PREVIEW_TIMEOUT_MS)}")
            return _preview(tenant=tenant, queue_filter=queue_filter, action=action)
    except OperationalError as exc:
        if getattr(getattr(exc, "__cause__", None), "sqlstate", None) != "57014":  # query_canceled
            raise
        log.warning("bulk.preview_timeout", tenant=tenant.slug, filter=queue_filter.as_dict(), action=action)
        raise PreviewTimeout(
            f"The preview took longer than {PREVIEW_TIMEOUT_MS / 1000:g} s and was stopped: narrow the "
            "filter (a reason, risk, age, agent or tool) and preview again.",
            details={"timeout_ms": PREVIEW_TIMEOUT_MS},
        ) from exc


def _preview(*, tenant: Tenant, queue_filter: QueueFilter, action: str) -> BulkPreview:
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
    needs_approval, capped = 0, False
    if action == BulkOperation.Action.COMPENSATE and by_risk:
        needs_approval, capped = _needs_approval(matching)
    return BulkPreview(
        count=sum(by_risk.values()),
        by_risk=by_risk,
        by_reason=by_reason,
        sample=sample,
        needs_approval=needs_approval,
        action=action,
        filter=queue_filter.as_dict(),
        needs_approval_capped=capped,
    )


# --- Start, abort ------------------------------------------------------------------------------


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
        jobs = [queueing.new_job_id() for _ in range(lanes_for(len(rows)))] if rows else []
        job_id = jobs[0] if jobs else queueing.new_job_id()
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
            jobs=jobs,
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
        record(
            bulk,
            actor=actor,
            kind="bulk.started",
            reason=reason,
            to_state=bulk.status,
            total=bulk.total,
            filter=bulk.filter,
            lanes=len(jobs),
        )
        for lane_job in jobs:
            transaction.on_commit(functools.partial(enqueue, bulk.pk, lane_job))
    return bulk


def bulk_abort(*, bulk: BulkOperation, actor: Actor, reason: str) -> BulkOperation:
    """Stop a running bulk: no further item is started (each item's transaction reads the
    operation's status ``FOR KEY SHARE``, which this ``FOR UPDATE`` waits for); what was decided
    stands. A bulk that is not running is 409."""
    reason = reason_required(reason)
    with transaction.atomic():
        locked = BulkOperation.objects.select_for_update().select_related("tenant").get(pk=bulk.pk)
        if locked.status != BulkOperation.Status.RUNNING:
            raise errors.InvalidTransition(
                locked,
                to=BulkOperation.Status.ABORTED,
                message=f"Bulk {locked.pk} is {locked.status}; only a running bulk can be aborted.",
            )
        bulk_aborted(locked, actor=actor, reason=reason)
    locked.refresh_from_db()
    return locked
