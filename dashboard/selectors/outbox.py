"""The outbox page's per-channel status: for each channel of the user's tenants — the tenant's
own channels and the installation's (``recovery.notifications.outbox.environment_channels``) —
its newest delivery, its newest failure with the reason, and how many of its notifications are
still to be sent.

Three queries whatever the outbox holds: the tenant channels with their figures as subqueries,
the tenants with the installation channels' figures as subqueries, and the rows those name. Each
subquery reads one short range of an index from its end (recovery/0018: ``notification_channel_
latest`` by channel id, ``notification_env_channel_latest`` by tenant and name), so no request
walks the outbox. Nothing here knows the channel kinds: a kind added later is shown like the rest.
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
    """The three subqueries of one channel's rows, as annotations named ``prefix``_…"""
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


def channel_statuses(*, tenant_ids: list[int]) -> list[ChannelStatus]:
    """Every channel of these tenants (the caller's: nothing of another tenant is read), by
    tenant, then the tenant's channels by name, then the installation's."""
    channels = list(
        NotificationChannel.objects.filter(tenant_id__in=tenant_ids)
        .select_related("tenant")
        .annotate(**_figures(Notification.objects.filter(channel_id=OuterRef("pk")), "c"))
        .order_by("tenant__slug", "name")
    )
    envs = environment_channels()
    tenants: list[Any] = []
    if envs:
        annotations: dict[str, Any] = {}
        for i, env in enumerate(envs):
            rows = Notification.objects.filter(
                tenant_id=OuterRef("pk"), channel__isnull=True, channel_name=env.name
            )
            annotations.update(_figures(rows, f"e{i}"))
        tenants = list(Tenant.objects.filter(pk__in=tenant_ids).annotate(**annotations).order_by("slug"))

    wanted: set[str] = set()
    for holder, prefixes in [(c, ["c"]) for c in channels] + [
        (t, [f"e{i}" for i in range(len(envs))]) for t in tenants
    ]:
        for prefix in prefixes:
            for figure in ("delivered", "failed", "retrying"):
                if pk := getattr(holder, f"{prefix}_{figure}"):
                    wanted.add(pk)
    rows = Notification.objects.in_bulk(list(wanted)) if wanted else {}

    def status(
        tenant: Tenant, name: str, kind: str, channel: NotificationChannel | None, holder: Any, prefix: str
    ) -> ChannelStatus:
        return ChannelStatus(
            tenant=tenant,
            name=name,
            kind=kind,
            channel=channel,
            last_delivered=rows.get(getattr(holder, f"{prefix}_delivered")),
            last_failed=_later(
                rows.get(getattr(holder, f"{prefix}_failed")), rows.get(getattr(holder, f"{prefix}_retrying"))
            ),
            pending=getattr(holder, f"{prefix}_pending"),
        )

    by_tenant: dict[int, list[ChannelStatus]] = {}
    for c in channels:
        by_tenant.setdefault(c.tenant_id, []).append(
            status(c.tenant, c.name, c.get_kind_display(), c, c, "c")
        )
    for t in tenants:
        for i, env in enumerate(envs):
            label = dict(NotificationChannel.Kind.choices).get(env.kind, env.kind)
            by_tenant.setdefault(t.pk, []).append(status(t, env.name, str(label), None, t, f"e{i}"))
    order = sorted(by_tenant, key=lambda pk: by_tenant[pk][0].tenant.slug)
    return [row for pk in order for row in by_tenant[pk]]

