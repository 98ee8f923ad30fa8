"""Away and back: an approver says they are away from a tenant until a moment, with who covers for
them (``ledger.away``), and what is already escalated to them goes to that person at once
(``recovery.transitions.delegation``); or says they are back before then. The one write the
dashboard's away page calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone

from ledger import away as ledger_away
from ledger.audit import Actor
from ledger.models import Membership, Tenant
from recovery.transitions import delegation

if TYPE_CHECKING:
    from django.contrib.auth.models import User


@dataclass(frozen=True)
class AwaySet:
    membership: Membership
    # How many approvals escalated to the person went to their delegate now.
    handed_over: int


@transaction.atomic
def away_set(
    *, user: User, tenant: Tenant, until: datetime, delegate: User, actor: Actor, now: datetime | None = None
) -> AwaySet:
    """``user`` is away from ``tenant`` until ``until`` and ``delegate`` covers
    (``ledger.away.membership_away_set``: its checks, 422 or 403 and nothing changed), and every
    pending approval escalated to them is handed over now, each audited. Setting it again replaces
    the until and the delegate (what was handed over stays where it went)."""
    now = now or timezone.now()
    membership = ledger_away.membership_away_set(
        user=user, tenant=tenant, until=until, delegate=delegate, actor=actor, now=now
    )
    handed = delegation.approvals_hand_over_for(
        tenant_id=tenant.pk, username=user.get_username(), actor=actor, now=now
    )
    return AwaySet(membership=membership, handed_over=handed)


@transaction.atomic
def away_clear(*, user: User, tenant: Tenant, actor: Actor, now: datetime | None = None) -> bool:
    """``user`` is back in ``tenant``; False when they were not away. What went to their delegate
    stays with the delegate, and they may decide it too."""
    return ledger_away.membership_away_clear(user=user, tenant=tenant, actor=actor, now=now) is not None
