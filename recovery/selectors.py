"""Reads shared by the operator API and the dashboard. Every lookup is tenant-scoped: another
tenant's object is simply not found (404, never 403, so existence does not leak)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from django.db.models import Model, QuerySet
from django.utils import timezone

from ledger import errors
from ledger.models import Tenant
from ledger.selectors import get_for_tenants
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep

M = TypeVar("M", bound=Model)
Tenants = Tenant | Iterable[Tenant] | Iterable[int]

UNRESOLVED = (RecoveryItem.Status.OPEN, RecoveryItem.Status.CLAIMED)


def _tenant_ids(tenants: Tenants) -> list[int]:
    return [tenants.pk] if isinstance(tenants, Tenant) else [getattr(t, "pk", t) for t in tenants]


@dataclass(frozen=True)
class Page(Generic[M]):
    items: list[M]
    next_cursor: str | None


def _keyset(queryset: QuerySet[M], *, cursor: str | None, limit: int) -> Page[M]:
    """Newest first by id: ids are time-ordered ULIDs, so the cursor is simply the last id seen
    (no OFFSET, no COUNT over a big table)."""
    if cursor:
        queryset = queryset.filter(pk__lt=cursor)
    rows = list(queryset.order_by("-pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(items=rows, next_cursor=rows[-1].pk if more and rows else None)


def item_get(*, tenants: Tenants, item_id: str) -> RecoveryItem:
    return get_for_tenants(
        RecoveryItem.objects.select_related("run", "run__tenant", "failed_action", "assignee", "claimed_by"),
        pk=item_id,
        tenants=tenants,
    )


def items_list(
    *,
    tenants: Tenants,
    status: str | None = None,
    reason: str | None = None,
    risk: str | None = None,
    older_than_minutes: int | None = None,
    run_id: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[RecoveryItem]:
    """The recovery queue. ``status`` defaults to unresolved (open and claimed); ``all`` lists
    every item."""
    queryset = RecoveryItem.objects.filter(tenant_id__in=_tenant_ids(tenants)).select_related(
        "run", "failed_action", "assignee", "claimed_by"
    )
    if status in (None, "", "unresolved"):
        queryset = queryset.filter(status__in=UNRESOLVED)
    elif status != "all":
        if status not in RecoveryItem.Status.values:
            raise errors.ValidationFailed(f"Unknown status {status!r}.", details={"status": status})
        queryset = queryset.filter(status=status)
    for name, value, choices in (
        ("reason", reason, RecoveryItem.Reason.values),
        ("risk", risk, ["low", "medium", "high", "critical"]),
    ):
        if value:
            if value not in choices:
                raise errors.ValidationFailed(f"Unknown {name} {value!r}.", details={name: value})
            queryset = queryset.filter(**{name: value})
    if older_than_minutes is not None:
        queryset = queryset.filter(opened_at__lt=timezone.now() - timedelta(minutes=older_than_minutes))
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    return _keyset(queryset, cursor=cursor, limit=limit)


def unwind_get(*, tenants: Tenants, unwind_id: str) -> Unwind:
    return get_for_tenants(Unwind.objects.select_related("run", "item"), pk=unwind_id, tenants=tenants)


def unwind_steps(*, unwind: Unwind) -> list[UnwindStep]:
    return list(unwind.steps.select_related("action", "approval").order_by("position"))


def unwinds_for_run(*, run_id: str) -> list[Unwind]:
    return list(Unwind.objects.filter(run_id=run_id).order_by("-created_at"))


def step_get(*, tenants: Tenants, step_id: str) -> UnwindStep:
    step = (
        UnwindStep.objects.select_related("unwind", "unwind__run", "action")
        .filter(pk=step_id, unwind__tenant_id__in=_tenant_ids(tenants))
        .first()
    )
    if step is None:
        raise errors.NotFound(f"UnwindStep {step_id} not found.", details={"id": step_id})
    return step


def approval_get(*, tenants: Tenants, approval_id: str) -> Approval:
    return get_for_tenants(
        Approval.objects.select_related("run", "run__tenant", "action", "step"),
        pk=approval_id,
        tenants=tenants,
    )


def approvals_list(
    *,
    tenants: Tenants,
    status: str | None = Approval.Status.PENDING,
    kind: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[Approval]:
    queryset = Approval.objects.filter(tenant_id__in=_tenant_ids(tenants)).select_related(
        "run", "action", "step"
    )
    if status and status != "all":
        if status not in Approval.Status.values:
            raise errors.ValidationFailed(f"Unknown status {status!r}.", details={"status": status})
        queryset = queryset.filter(status=status)
    if kind:
        if kind not in Approval.Kind.values:
            raise errors.ValidationFailed(f"Unknown kind {kind!r}.", details={"kind": kind})
        queryset = queryset.filter(kind=kind)
    return _keyset(queryset, cursor=cursor, limit=limit)


def item_age_seconds(item: RecoveryItem, *, now: Any = None) -> int:
    end = item.resolved_at or now or timezone.now()
    return max(0, int((end - item.opened_at).total_seconds()))
