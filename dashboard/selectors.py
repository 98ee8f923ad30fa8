"""Reads that only the dashboard needs: the queue (filters, search, keyset pages, groups), the
run page bundle, the approval inbox and the metrics. Every read is scoped to the user's tenants.

No list here counts the ledger: pages are keyset-paginated (fetch one row more than shown), and
the only counts are over small, indexed sets (pending approvals, new queue items, capped).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import (
    Aggregate,
    Avg,
    Case,
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    Func,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Value,
    When,
)
from django.utils import timezone

from dashboard import permissions
from dashboard.permissions import Someone
from ledger.conf import saga
from ledger.ids import looks_like_id
from ledger.models import Action, Checkpoint, Compensator, Event, Risk, Run, Tenant, ToolPolicy
from ledger.pagination import OLDEST_FIRST, Key, keyset_page
from ledger.policies import policies_in_force, policy_settings_for
from ledger.selectors import checkpoints_for_run, run_warnings
from recovery import selectors as recovery_selectors
from recovery.approvals import pending_q
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from recovery.trail import run_trail

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

APPROVAL_BADGE_CAP = 99
NEW_ITEMS_CAP = 100
GROUPS_SHOWN = 8

AGE_CHOICES = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "4h": timedelta(hours=4),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
SORTS = ("newest", "oldest", "risk")

_RISK_RANK = Case(
    *[
        When(risk=risk, then=Value(rank))
        for risk, rank in ((Risk.LOW, 0), (Risk.MEDIUM, 1), (Risk.HIGH, 2), (Risk.CRITICAL, 3))
    ],
    default=Value(0),
    output_field=IntegerField(),
)

# (field, descending) per sort; the last field is always the unique id, so the order is total
# and a keyset cursor never skips or repeats a row.
_SORT_KEYS: dict[str, list[Key]] = {
    "newest": [("opened_at", True), ("id", True)],
    "oldest": [("opened_at", False), ("id", False)],
    "risk": [("risk_rank", True), ("opened_at", False), ("id", False)],
}


# --- Queue ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueFilters:
    tenant: str = ""
    risk: str = ""
    reason: str = ""
    status: str = "unresolved"
    age: str = ""
    q: str = ""
    sort: str = "newest"
    signature: str = ""

    def as_query(self) -> dict[str, str]:
        """The non-default filters, for links that keep them (pagination, polling)."""
        defaults = QueueFilters()
        return {
            name: value for name, value in self.__dict__.items() if value and value != getattr(defaults, name)
        }


class QueueRowAnnotations(TypedDict):
    """What ``queue_page`` annotates each item with (the template reads ``approval_pending``)."""

    risk_rank: int
    approval_pending: bool


@dataclass
class QueuePage:
    items: list[WithAnnotations[RecoveryItem, QueueRowAnnotations]]
    next_cursor: str = ""
    # When the page was read: the auto-refresh counts items opened after it, whatever the sort.
    read_at: datetime | None = None


def _filtered_items(*, user: Someone, filters: QueueFilters, now: datetime) -> QuerySet[RecoveryItem]:
    """The queue's one filter (``recovery.selectors.queue_items``) over the user's tenants."""
    return recovery_selectors.queue_items(
        tenants=permissions.tenant_ids_for(user),
        status=filters.status,
        reason=filters.reason,
        risk=filters.risk,
        older_than=AGE_CHOICES.get(filters.age),
        tenant_slug=filters.tenant,
        signature=filters.signature,
        search=filters.q,
        now=now,
    )


def queue_page(
    *, user: Someone, filters: QueueFilters, cursor: str = "", page_size: int | None = None
) -> QueuePage:
    now = timezone.now()
    size = page_size or saga().page_size
    keys = _SORT_KEYS.get(filters.sort, _SORT_KEYS["newest"])
    qs = (
        _filtered_items(user=user, filters=filters, now=now)
        .select_related("run", "tenant", "failed_action", "assignee", "claimed_by")
        .annotate(
            risk_rank=_RISK_RANK,
            approval_pending=Exists(Approval.objects.filter(pending_q(now=now), run_id=OuterRef("run_id"))),
        )
    )
    page = keyset_page(qs, keys=keys, cursor=cursor, limit=size, strict=False)
    return QueuePage(items=page.items, next_cursor=page.next_cursor or "", read_at=now)


def queue_new_count(*, user: Someone, filters: QueueFilters, since: datetime) -> int:
    """Items matching the filters opened after ``since``, counted up to NEW_ITEMS_CAP + 1."""
    qs = _filtered_items(user=user, filters=filters, now=timezone.now()).filter(opened_at__gt=since)
    return len(qs.order_by().values_list("pk", flat=True)[: NEW_ITEMS_CAP + 1])


@dataclass(frozen=True)
class FailureGroup:
    signature: str
    count: int
    tool: str
    error: str
    oldest: datetime
    max_risk_rank: int


def queue_groups(*, user: Someone, filters: QueueFilters) -> list[FailureGroup]:
    """Similar unresolved failures (same tool + normalised error) with how many there are."""
    base = _filtered_items(
        user=user, filters=QueueFilters(**{**filters.__dict__, "signature": ""}), now=timezone.now()
    )
    # Aggregated on the items alone, from the columns of the covering index
    # ``recovery_unresolved_groups`` (an index-only scan): joining every unresolved item to the
    # ledger's actions for the tool's name cost more than the rest of the page. The tool and the
    # error are the same across a group up to normalisation (both make the signature), so the
    # newest item of each group shown speaks for it: one lookup by primary key.
    rows = list(
        base.exclude(signature="")
        .order_by()
        .values("signature")
        .annotate(
            count=Count("id"),
            sample_id=Max("id"),
            oldest=Min("opened_at"),
            max_risk_rank=Max(_RISK_RANK),
        )
        .filter(count__gt=1)
        .order_by("-count", "oldest")[:GROUPS_SHOWN]
    )
    samples = {
        pk: (tool or "", error)
        for pk, tool, error in RecoveryItem.objects.filter(pk__in=[row["sample_id"] for row in rows])
        .order_by()
        .values_list("pk", "failed_action__tool", "error")
    }
    return [
        FailureGroup(
            signature=row["signature"],
            count=row["count"],
            tool=samples.get(row["sample_id"], ("", ""))[0],
            error=samples.get(row["sample_id"], ("", ""))[1],
            oldest=row["oldest"],
            max_risk_rank=row["max_risk_rank"],
        )
        for row in rows
    ]


def visible_tenants(*, user: Someone) -> list[Tenant]:
    return list(Tenant.objects.filter(pk__in=permissions.tenant_ids_for(user)).order_by("slug"))


def items_for_user(*, user: Someone, ids: list[str]) -> list[RecoveryItem]:
    """The items among ``ids`` (a form's, so anything) that exist in the user's tenants."""
    return list(
        RecoveryItem.objects.filter(
            pk__in=[pk for pk in ids if looks_like_id(pk)], tenant_id__in=permissions.tenant_ids_for(user)
        ).select_related("run", "tenant", "failed_action")
    )


# --- Run page ---------------------------------------------------------------------------------


# A run page shows the newest checkpoints and audit events and says how many older ones there are:
# an agent that checkpoints in a loop must not make the operator's page unbounded.
RUN_PAGE_CHECKPOINTS = 20
RUN_PAGE_EVENTS = 200


@dataclass
class RunPage:
    run: Run
    actions: list[Action]
    warnings: list[dict[str, str]]
    checkpoints: list[Checkpoint]
    events: list[Event]
    item: RecoveryItem | None
    unwind: Unwind | None
    approvals: list[Approval] = field(default_factory=list)
    trail: Any = None
    older_checkpoints: int = 0  # not shown: older than the newest RUN_PAGE_CHECKPOINTS
    older_events: int = 0  # not shown: older than the newest RUN_PAGE_EVENTS


def newest_checkpoints(*, run: Run, limit: int = RUN_PAGE_CHECKPOINTS) -> tuple[list[Checkpoint], int]:
    """The newest ``limit`` checkpoints (newest first) and how many older ones are not in it."""
    checkpoints = list(checkpoints_for_run(run=run)[:limit])
    older = checkpoints_for_run(run=run).count() - limit if len(checkpoints) == limit else 0
    return checkpoints, older


def run_for_user(*, user: Someone, run_id: str) -> Run | None:
    return (
        Run.objects.select_related("tenant", "failed_action")
        .filter(pk=run_id, tenant_id__in=permissions.tenant_ids_for(user))
        .first()
    )


def unwind_with_steps(*, unwind_id: str, tenant_ids: list[int]) -> Unwind | None:
    return (
        Unwind.objects.select_related("run", "tenant", "requested_by")
        .prefetch_related(
            Prefetch(
                "steps", queryset=UnwindStep.objects.select_related("action", "approval").order_by("position")
            )
        )
        .filter(pk=unwind_id, tenant_id__in=tenant_ids)
        .first()
    )


def run_actions(*, run: Run) -> list[Action]:
    """The run's ledger, in the order it was written."""
    return list(Action.objects.filter(run=run).order_by("seq"))


def run_page(*, run: Run) -> RunPage:
    actions = run_actions(run=run)
    checkpoints, older_checkpoints = newest_checkpoints(run=run)
    events = list(Event.objects.filter(run=run).order_by("-id")[:RUN_PAGE_EVENTS])[::-1]
    older_events = (
        Event.objects.filter(run=run).count() - RUN_PAGE_EVENTS if len(events) == RUN_PAGE_EVENTS else 0
    )
    item = (
        RecoveryItem.objects.filter(run=run)
        .select_related("assignee", "claimed_by", "resolved_by", "failed_action")
        .order_by(
            Case(When(status__in=RecoveryItem.UNRESOLVED, then=Value(0)), default=Value(1)), "-opened_at"
        )
        .first()
    )
    latest_unwind = (
        Unwind.objects.filter(run=run).order_by("-created_at").values_list("pk", flat=True).first()
    )
    unwind = unwind_with_steps(unwind_id=latest_unwind, tenant_ids=[run.tenant_id]) if latest_unwind else None
    approvals = list(
        Approval.objects.filter(pending_q(), run=run).select_related("action").order_by("created_at")
    )
    return RunPage(
        run=run,
        actions=actions,
        warnings=run_warnings(run=run, actions=actions),
        checkpoints=checkpoints,
        events=events,
        item=item,
        unwind=unwind,
        approvals=approvals,
        trail=run_trail(run=run),
        older_checkpoints=older_checkpoints,
        older_events=older_events,
    )


# --- Approvals --------------------------------------------------------------------------------


APPROVALS_PAGE = 50


@dataclass
class ApprovalPage:
    approvals: list[Approval]
    next_cursor: str = ""


def approvals_pending(*, user: Someone, cursor: str = "", page_size: int | None = None) -> ApprovalPage:
    """Pending approvals, oldest (closest to expiring) first, one keyset page at a time: each card
    carries two forms and pretty-printed JSON, so a page of hundreds took longer to render than
    an approver reads."""
    qs = recovery_selectors.approvals_pending(tenants=permissions.tenant_ids_for(user)).select_related(
        "action", "run", "tenant", "step", "requested_by", "requested_by_key"
    )
    page = keyset_page(qs, keys=OLDEST_FIRST, cursor=cursor, limit=page_size or APPROVALS_PAGE, strict=False)
    return ApprovalPage(approvals=page.items, next_cursor=page.next_cursor or "")


def approvals_pending_count(*, user: Someone) -> int:
    qs = recovery_selectors.approvals_pending(tenants=permissions.tenant_ids_for(user))
    return len(qs.order_by().values_list("pk", flat=True)[: APPROVAL_BADGE_CAP + 1])


# --- Metrics ----------------------------------------------------------------------------------


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


METRIC_WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}


@dataclass
class Metrics:
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


def metrics(*, user: Someone, window: str, tenant: str = "") -> Metrics:
    span = METRIC_WINDOWS.get(window, METRIC_WINDOWS["7d"])
    window = window if window in METRIC_WINDOWS else "7d"
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
    return Metrics(
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


# --- Policies ---------------------------------------------------------------------------------


@dataclass
class TenantPolicies:
    tenant: Tenant
    policies: list[ToolPolicy]
    compensators: list[Compensator]
    settings_source: str
    default_policy: dict[str, Any]
    unwind: dict[str, Any]
    auto_compensate: dict[str, Any]


def policies_for(*, tenant: Tenant) -> TenantPolicies:
    own = list(Compensator.objects.filter(tenant=tenant).order_by("tool"))
    overridden = {c.tool for c in own}
    shared = [
        c
        for c in Compensator.objects.filter(tenant__isnull=True).order_by("tool")
        if c.tool not in overridden
    ]
    policy_settings = policy_settings_for(tenant)
    return TenantPolicies(
        tenant=tenant,
        policies=policies_in_force(tenant=tenant),
        compensators=sorted(own + shared, key=lambda c: c.tool),
        settings_source=policy_settings.source,
        default_policy=policy_settings.default_policy,
        unwind=policy_settings.unwind,
        auto_compensate=policy_settings.auto_compensate,
    )
