"""The queue page's reads: what it lists (``QueueView``: the queue's one filter, the age as
chosen and the sort), keyset pages of items, the count of
items new since the page was read, the groups of similar failures, and the items a bulk decision
names. Every read is scoped to the user's tenants; no list counts the ledger (pages fetch one row
more than shown, the new-items count is capped)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.db import connection
from django.db.models import (
    Case,
    Count,
    Exists,
    IntegerField,
    Max,
    Min,
    OuterRef,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.utils import timezone

from dashboard import permissions
from dashboard.permissions import Someone
from infra.conf import saga
from infra.ids import looks_like_id
from infra.pagination import Key, keyset_page
from ledger.models import Risk
from recovery.actions.commands import overdue_before
from recovery.models import AgentCommand, Approval, RecoveryItem
from recovery.selectors import QueueFilter
from recovery.transitions.approvals import pending_q

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


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


@dataclass(frozen=True)
class QueueView:
    """What the queue page lists: the queue's one filter (``recovery.selectors.QueueFilter``,
    built by ``dashboard.forms.QueueFilterForm``) with the page's own choices beside it, the age
    as chosen (a key of ``AGE_CHOICES``, which the filter holds as ``older_than``) and the sort."""

    queue_filter: QueueFilter = field(default_factory=QueueFilter)
    age: str = ""
    sort: str = "newest"

    def as_query(self) -> dict[str, str]:
        """The non-default filters in the form's names, for links that keep them (pagination,
        polling)."""
        f = self.queue_filter
        query = {
            "tenant": f.tenant_slug,
            "risk": f.risk,
            "reason": f.reason,
            "status": "" if f.status == "unresolved" else f.status,
            "age": self.age,
            "q": f.search,
            "sort": "" if self.sort == "newest" else self.sort,
            "signature": f.signature,
            "agent": f.agent,
            "tool": f.tool,
        }
        return {name: value for name, value in query.items() if value}


class QueueRowAnnotations(TypedDict):
    """What ``queue_page`` annotates each item with (the template reads ``approval_pending``)."""

    risk_rank: int
    approval_pending: bool
    resume_overdue_since: datetime | None


@dataclass
class QueuePage:
    items: list[WithAnnotations[RecoveryItem, QueueRowAnnotations]]
    next_cursor: str = ""
    # When the page was read: the auto-refresh counts items opened after it, whatever the sort.
    read_at: datetime | None = None


def _filtered_items(*, user: Someone, view: QueueView, now: datetime) -> QuerySet[RecoveryItem]:
    """The queue's one filter over the user's tenants."""
    return view.queue_filter.items(tenants=permissions.tenant_ids_for(user), now=now)


def queue_page(
    *, user: Someone, view: QueueView, cursor: str = "", page_size: int | None = None
) -> QueuePage:
    now = timezone.now()
    size = page_size or saga().page_size
    keys = _SORT_KEYS.get(view.sort, _SORT_KEYS["newest"])
    qs = (
        _filtered_items(user=user, view=view, now=now)
        .select_related("run", "tenant", "failed_action", "assignee", "claimed_by")
        .annotate(
            risk_rank=_RISK_RANK,
            approval_pending=Exists(Approval.objects.filter(pending_q(now=now), run_id=OuterRef("run_id"))),
            # "Resume sent n min ago, not picked up": the run's oldest overdue resume command.
            resume_overdue_since=Subquery(
                AgentCommand.objects.filter(
                    run_id=OuterRef("run_id"),
                    kind=AgentCommand.Kind.RESUME,
                    status=AgentCommand.Status.PENDING,
                    created_at__lt=overdue_before(now),
                )
                .order_by("created_at")
                .values("created_at")[:1]
            ),
        )
    )
    page = keyset_page(qs, keys=keys, cursor=cursor, limit=size, strict=False)
    return QueuePage(items=page.items, next_cursor=page.next_cursor or "", read_at=now)


def queue_new_count(*, user: Someone, view: QueueView, since: datetime) -> int:
    """Items matching the filter opened after ``since``, counted up to NEW_ITEMS_CAP + 1."""
    qs = _filtered_items(user=user, view=view, now=timezone.now()).filter(opened_at__gt=since)
    return len(qs.order_by().values_list("pk", flat=True)[: NEW_ITEMS_CAP + 1])


@dataclass(frozen=True)
class FailureGroup:
    signature: str
    count: int
    tool: str
    error: str
    oldest: datetime
    max_risk_rank: int


def queue_groups(*, user: Someone, view: QueueView) -> list[FailureGroup]:
    """Similar unresolved failures (same tool + normalised error) with how many there are."""
    every_group = replace(view, queue_filter=replace(view.queue_filter, signature=""))
    base = _filtered_items(user=user, view=every_group, now=timezone.now())
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


def items_for_user(*, user: Someone, ids: list[str]) -> list[RecoveryItem]:
    """The items among ``ids`` (a form's, so anything) that exist in the user's tenants."""
    return list(
        RecoveryItem.objects.filter(
            pk__in=[pk for pk in ids if looks_like_id(pk)], tenant_id__in=permissions.tenant_ids_for(user)
        ).select_related("run", "tenant", "failed_action")
    )


# Counts beside saved filters and the queue's choices are capped, like the new-items count: a
# filter over every item ever opened must not count the whole table on each page view.
COUNT_CAP = 999


def queue_counts(*, user: Someone, views: dict[int, QueueView]) -> dict[int, int]:
    """How many items each of ``views`` matches now, each counted up to COUNT_CAP + 1, in one
    statement (a capped subquery per view, joined by UNION ALL). A filter with a search term still
    reads its exact-id probe first (``recovery.selectors._search``)."""
    if not views:
        return {}
    now = timezone.now()
    parts: list[str] = []
    params: list[Any] = []
    for key, view in views.items():
        capped = _filtered_items(user=user, view=view, now=now).order_by().values("pk")[: COUNT_CAP + 1]
        sql, sub_params = capped.query.sql_with_params()
        # The key is an int we chose; the rest is the ORM's own SQL with its parameters.
        parts.append(f"SELECT {int(key)} AS k, count(*) AS n FROM ({sql}) AS capped")  # noqa: S608
        params.extend(sub_params)
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        return {int(key): int(count) for key, count in cursor.fetchall()}


@dataclass(frozen=True)
class QueueFacets:
    """What waits in the queue (unresolved items of the user's tenants) by reason and by risk."""

    reasons: dict[str, int]
    risks: dict[str, int]
    total: int


def queue_facets(*, user: Someone) -> QueueFacets:
    """Unresolved items by reason and risk: one grouped query over the queue (never one per
    choice). Resolved items are history, not counted here."""
    rows = (
        RecoveryItem.objects.filter(
            tenant_id__in=permissions.tenant_ids_for(user), status__in=RecoveryItem.UNRESOLVED
        )
        .order_by()
        .values_list("reason", "risk")
        .annotate(n=Count("id"))
    )
    reasons: dict[str, int] = {}
    risks: dict[str, int] = {}
    for reason, risk, n in rows:
        reasons[reason] = reasons.get(reason, 0) + n
        risks[risk] = risks.get(risk, 0) + n
    return QueueFacets(reasons=reasons, risks=risks, total=sum(reasons.values()))
