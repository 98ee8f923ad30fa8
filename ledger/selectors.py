"""Reads shared by the API and the dashboard. Every lookup is scoped to a tenant (or a set of
tenants): another tenant's object is simply not found."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from django.db.models import Model, QuerySet

from ledger import errors
from ledger.models import Action, Checkpoint, Run, Tenant
from ledger.rules import COMPENSATABLE_CLASSES, is_pivot, pivot_order_warning

M = TypeVar("M", bound=Model)


def get_for_tenants(
    queryset: QuerySet[M], *, pk: str, tenants: Tenant | Iterable[Tenant] | Iterable[int]
) -> M:
    tenant_ids = [tenants.pk] if isinstance(tenants, Tenant) else [getattr(t, "pk", t) for t in tenants]
    obj = queryset.filter(pk=pk, tenant_id__in=tenant_ids).first()
    if obj is None:
        raise errors.NotFound(f"{queryset.model.__name__} {pk} not found.", details={"id": pk})
    return obj


def run_get(*, tenant: Tenant, run_id: str) -> Run:
    return get_for_tenants(Run.objects.select_related("tenant"), pk=run_id, tenants=tenant)


def action_get(*, tenant: Tenant, action_id: str) -> Action:
    return get_for_tenants(Action.objects.select_related("run", "run__tenant"), pk=action_id, tenants=tenant)


def checkpoints_for_run(*, run: Run) -> QuerySet[Checkpoint]:
    """A run's checkpoints, newest first: the order every list of them and "the latest" use."""
    return Checkpoint.objects.filter(run=run).order_by("-created_at", "-id")


def checkpoint_latest(*, run: Run) -> Checkpoint | None:
    return checkpoints_for_run(run=run).first()


def run_warnings(*, run: Run, actions: Iterable[Action] | None = None) -> list[dict[str, Any]]:
    """Pivot-order (``ledger.rules``) and unknown-outcome warnings for a run, from its actions."""
    ordered = sorted(actions if actions is not None else run.actions.all(), key=lambda a: a.seq)
    warnings: list[dict[str, Any]] = []
    pivot: Action | None = None
    for action in ordered:
        if action.status == Action.Status.REJECTED:
            continue
        if pivot is None and is_pivot(action.action_class, action.status):
            pivot = action
        elif pivot is not None and action.action_class in COMPENSATABLE_CLASSES:
            warnings.append(
                pivot_order_warning(
                    action_id=action.pk,
                    tool=action.tool,
                    seq=action.seq,
                    pivot_id=pivot.pk,
                    pivot_tool=pivot.tool,
                    pivot_seq=pivot.seq,
                )
            )
        if action.status == Action.Status.UNKNOWN:
            warnings.append(
                {
                    "code": "outcome_unknown",
                    "action_id": action.pk,
                    "message": (
                        f"{action.tool} (#{action.seq}) timed out and may have happened; reconcile it "
                        "(confirm done or not done) before resuming or compensating."
                    ),
                }
            )
    return warnings
