"""The outbox page's per-channel status: for each channel of the user's tenants — the tenant's
own channels and the installation's (``recovery.notifications.outbox.environment_channels``) —
its newest delivery, its newest failure with the reason, and how many of its notifications are
still to be sent.

Three queries whatever the outbox holds: the tenant channels with their figures as subqueries,
the tenants with the installation channels' figures as subqueries, and the rows those name. Each
subquery reads one short range of an index from its end (recovery/0019: by channel id for a
tenant's channel, by tenant and ``channel_name`` for an installation's), so no request walks the
outbox; the backlog counts only undelivered rows. Two webhook URLs on one host share their name
(``SAGA_NOTIFY_WEBHOOKS <host>``) and so their figures. Nothing here knows the channel kinds: a
kind added later is shown like the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F, Func, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from ledger.models import Tenant
from recovery.models import Notification, NotificationChannel
from recovery.notifications.outbox import environment_channels

Status = Notification.Status
UNDELIVERED = (Status.PENDING, Status.SENDING)


@dataclass(frozen=True)
class ChannelStatus:
    tenant: Tenant
    name: str
    kind: str  # the kind's label
    # None for an installation channel (SAGA_NOTIFY_EMAILS, SAGA_NOTIFY_WEBHOOKS).
    channel: NotificationChannel | None
    last_delivered: Notification | None
    # The newest notification that failed for good, or that is being retried after a failed
    # attempt; its ``last_error`` and ``last_status_code`` say why.
    last_failed: Notification | None
    pending: int

    @property
    def key(self) -> str:
        """A stable name for the row on the page: the channel's id, or the tenant and name."""
        return self.channel.pk if self.channel is not None else f"{self.tenant.slug}:{self.name}"


def _newest(rows: QuerySet[Notification]) -> Subquery:
    return Subquery(rows.order_by("-created_at").values("pk")[:1])


def _pending(rows: QuerySet[Notification]) -> Coalesce:
    counted = rows.filter(status__in=UNDELIVERED).order_by().annotate(n=Func(F("pk"), function="COUNT"))
    return Coalesce(Subquery(counted.values("n")[:1], output_field=IntegerField()), 0)


def _figures(rows: QuerySet[Notification], prefix: str) -> dict[str, Any]:
    """The subqueries of one channel's rows, as annotations named ``prefix``_…"""
    return {
        f"{prefix}_delivered": _newest(rows.filter(status=Status.DELIVERED)),
        f"{prefix}_failed": _newest(rows.filter(status=Status.FAILED)),
        # A failed attempt being retried: among the few undelivered rows.
        f"{prefix}_retrying": _newest(rows.filter(status__in=UNDELIVERED).exclude(last_error="")),
        f"{prefix}_pending": _pending(rows),
    }


def _later(a: Notification | None, b: Notification | None) -> Notification | None:
    if a is None or b is None:
        return a or b
    return a if a.created_at >= b.created_at else b


_FIGURES = ("delivered", "failed", "retrying")


@dataclass(frozen=True)
class _Found:
    """One channel as the queries found it: what it is, and the row holding its annotations."""

    tenant: Tenant
    name: str
    kind: str
    channel: NotificationChannel | None
    holder: Any
    prefix: str

    def pk(self, figure: str) -> str | None:
        value: str | None = getattr(self.holder, f"{self.prefix}_{figure}")
        return value


def _found(tenant_ids: list[int]) -> list[_Found]:
    channels = (
        NotificationChannel.objects.filter(tenant_id__in=tenant_ids)
        .select_related("tenant")
        .annotate(**_figures(Notification.objects.filter(channel_id=OuterRef("pk")), "c"))
        .order_by("tenant__slug", "name")
    )
    found = [_Found(c.tenant, c.name, c.get_kind_display(), c, c, "c") for c in channels]
    envs = environment_channels()
    if not envs:
        return found
    annotations: dict[str, Any] = {}
    for i, env in enumerate(envs):
        rows = Notification.objects.filter(
            tenant_id=OuterRef("pk"), channel__isnull=True, channel_name=env.name
        )
        annotations.update(_figures(rows, f"e{i}"))
    kinds = dict(NotificationChannel.Kind.choices)
    for tenant in Tenant.objects.filter(pk__in=tenant_ids).annotate(**annotations):
        for i, env in enumerate(envs):
            found.append(_Found(tenant, env.name, str(kinds.get(env.kind, env.kind)), None, tenant, f"e{i}"))
    return found


def channel_statuses(*, tenant_ids: list[int]) -> list[ChannelStatus]:
    """Every channel of these tenants (the caller's: nothing of another tenant is read), by
    tenant, then the tenant's channels by name, then the installation's."""
    found = _found(tenant_ids)
    wanted = [pk for f in found for figure in _FIGURES if (pk := f.pk(figure))]
    rows = Notification.objects.in_bulk(wanted) if wanted else {}

    def row(f: _Found, figure: str) -> Notification | None:
        pk = f.pk(figure)
        return rows.get(pk) if pk else None

    statuses = [
        ChannelStatus(
            tenant=f.tenant,
            name=f.name,
            kind=f.kind,
            channel=f.channel,
            last_delivered=row(f, "delivered"),
            last_failed=_later(row(f, "failed"), row(f, "retrying")),
            pending=getattr(f.holder, f"{f.prefix}_pending"),
        )
        for f in found
    ]
    # By tenant (a stable sort keeps each tenant's own channels, by name, before the installation's).
    return sorted(statuses, key=lambda s: s.tenant.slug)
