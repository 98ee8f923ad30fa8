"""What the inbox and the away page read of aways (``ledger.away``): the signed-in person's own
aways and the ones they cover, the people who may cover for them per tenant, and until when the
person a delegated approval came from is away."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.utils import timezone

from ledger.away import COVERING_ROLES, away_q
from ledger.models import Membership, Tenant
from recovery.models import Approval


@dataclass(frozen=True)
class AwayNote:
    tenant: str
    username: str
    until: datetime
    # Own: "you are away, covered by ``username``"; else "you cover for ``username``".
    own: bool


def away_notes(user: User, *, now: datetime | None = None) -> list[AwayNote]:
    """The user's aways in force (who covers) and the aways they cover (for whom), two queries."""
    now = now or timezone.now()
    own = (
        Membership.objects.filter(away_q(now=now), user=user)
        .select_related("tenant", "away_delegate")
        .order_by("tenant__slug")
    )
    covered = (
        Membership.objects.filter(away_q(now=now), away_delegate=user)
        .select_related("tenant", "user")
        .order_by("tenant__slug", "user__username")
    )
    notes = [
        AwayNote(
            tenant=m.tenant.slug,
            username=m.away_delegate.get_username() if m.away_delegate else "nobody",
            until=m.away_until,
            own=True,
        )
        for m in own
        if m.away_until is not None
    ]
    notes += [
        AwayNote(tenant=m.tenant.slug, username=m.user.get_username(), until=m.away_until, own=False)
        for m in covered
        if m.away_until is not None
    ]
    return notes


def own_aways(user: User, *, now: datetime | None = None) -> dict[int, Membership]:
    """tenant id → the user's membership there while they are away now."""
    now = now or timezone.now()
    found = Membership.objects.filter(away_q(now=now), user=user).select_related("away_delegate")
    return {m.tenant_id: m for m in found}


def delegate_choices(user: User, tenants: list[Tenant]) -> list[tuple[Tenant, list[str]]]:
    """Per tenant, the usernames of who may cover for ``user`` there: its other active approvers
    and admins."""
    rows = (
        Membership.objects.filter(tenant__in=tenants, role__in=COVERING_ROLES, user__is_active=True)
        .exclude(user=user)
        .order_by("user__username")
        .values_list("tenant_id", "user__username")
    )
    names: dict[int, list[str]] = {t.pk: [] for t in tenants}
    for tenant_id, username in rows:
        names[tenant_id].append(username)
    return [(t, names[t.pk]) for t in tenants]


def delegated_from_until(approval: Approval, *, now: datetime | None = None) -> datetime | None:
    """Until when the person a delegated approval came from is away (None: back, or not delegated)."""
    if not approval.delegated_from:
        return None
    return (
        Membership.objects.filter(
            away_q(now=now or timezone.now()),
            tenant_id=approval.tenant_id,
            user__username=approval.delegated_from,
        )
        .values_list("away_until", flat=True)
        .first()
    )
