"""The insights page's reads: open items by risk and reason, time to resolve, compensation outcomes
and durations, approval waits (percentiles from PostgreSQL) and the most failing tools, over a
window and the user's tenants."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Aggregate, Avg, Count, DurationField, ExpressionWrapper, F, FloatField, Func, Q
from django.utils import timezone

from dashboard import permissions
from dashboard.permissions import Someone
from ledger.models import Action, Risk, Tenant
from recovery.models import Approval, RecoveryItem, Unwind


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(f) WITHIN GROUP (ORDER BY expr)``."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression: Any, *, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


class EpochSeconds(Func):
    template = "EXTRACT(EPOCH FROM %(expressions)s)"
    output_field = FloatField()


def _seconds_between(start: str, end: str) -> EpochSeconds:
    return EpochSeconds(ExpressionWrapper(F(end) - F(start), output_field=DurationField()))


INSIGHT_WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}


@dataclass
class Insights:
    window: str
    since: datetime
    open_by_risk: list[tuple[str, int]]
    open_by_reason: list[tuple[str, int]]
    mttr_s: float | None
    resolved: int
    unwinds_completed: int
    unwinds_failed: int
    unwind_p50_s: float | None
    unwind_p95_s: float | None
    approval_p50_s: float | None
    approval_p95_s: float | None
    approvals_decided: int
    top_failing_tools: list[tuple[str, int]]

    @property
    def compensation_success_rate(self) -> float | None:
        finished = self.unwinds_completed + self.unwinds_failed
        return self.unwinds_completed / finished if finished else None


def insights(*, user: Someone, window: str, tenant: str = "") -> Insights:
    span = INSIGHT_WINDOWS.get(window, INSIGHT_WINDOWS["7d"])
    window = window if window in INSIGHT_WINDOWS else "7d"
    since = timezone.now() - span
    tenant_ids = permissions.tenant_ids_for(user)
    if tenant:
        tenant_ids = list(Tenant.objects.filter(pk__in=tenant_ids, slug=tenant).values_list("pk", flat=True))

    # One pass over the unresolved items for both panels (it was one pass each).
    by_risk: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    for risk, reason, n in (
        RecoveryItem.objects.filter(tenant_id__in=tenant_ids, status__in=RecoveryItem.UNRESOLVED)
        .order_by()
        .values_list("risk", "reason")
        .annotate(n=Count("id"))
    ):
        by_risk[risk] = by_risk.get(risk, 0) + n
        by_reason[reason] = by_reason.get(reason, 0) + n

    resolved = RecoveryItem.objects.filter(
        tenant_id__in=tenant_ids, status=RecoveryItem.Status.RESOLVED, resolved_at__gte=since
    ).aggregate(n=Count("id"), mttr=Avg(_seconds_between("opened_at", "resolved_at")))

    finished_unwinds = Unwind.objects.filter(
        tenant_id__in=tenant_ids,
        finished_at__gte=since,
        status__in=[Unwind.Status.COMPLETED, Unwind.Status.FAILED],
    )
    unwind_stats = finished_unwinds.aggregate(
        completed=Count("id", filter=Q(status=Unwind.Status.COMPLETED)),
        failed=Count("id", filter=Q(status=Unwind.Status.FAILED)),
        p50=PercentileCont(_seconds_between("created_at", "finished_at"), fraction=0.5),
        p95=PercentileCont(_seconds_between("created_at", "finished_at"), fraction=0.95),
    )
    approval_stats = Approval.objects.filter(
        tenant_id__in=tenant_ids,
        decided_at__gte=since,
        status__in=[Approval.Status.APPROVED, Approval.Status.REJECTED],
    ).aggregate(
        n=Count("id"),
        p50=PercentileCont(_seconds_between("created_at", "decided_at"), fraction=0.5),
        p95=PercentileCont(_seconds_between("created_at", "decided_at"), fraction=0.95),
    )
    failing = (
        Action.objects.filter(
            tenant_id__in=tenant_ids,
            updated_at__gte=since,
            status__in=[Action.Status.FAILED, Action.Status.UNKNOWN, Action.Status.COMPENSATION_FAILED],
        )
        .order_by()
        .values_list("tool")
        .annotate(n=Count("id"))
        .order_by("-n", "tool")[:10]
    )
    return Insights(
        window=window,
        since=since,
        open_by_risk=[(risk.label, by_risk.get(risk.value, 0)) for risk in Risk],
        open_by_reason=[
            (reason.label, by_reason[reason.value])
            for reason in RecoveryItem.Reason
            if by_reason.get(reason.value)
        ],
        mttr_s=resolved["mttr"],
        resolved=resolved["n"],
        unwinds_completed=unwind_stats["completed"],
        unwinds_failed=unwind_stats["failed"],
        unwind_p50_s=unwind_stats["p50"],
        unwind_p95_s=unwind_stats["p95"],
        approval_p50_s=approval_stats["p50"],
        approval_p95_s=approval_stats["p95"],
        approvals_decided=approval_stats["n"],
        top_failing_tools=[(tool, n) for tool, n in failing],
    )
