"""Away: an approver of a tenant says they are away until a moment, and names who covers for them
(another approver or admin of the tenant). Away begins when it is set and ends by itself at
``away_until`` (nothing has to run for it to end). What goes to an away person instead
(``recovery.transitions.delegation``): an approval escalated to them by name, and the e-mail that
tells them so.

Delegation follows a chain: when the delegate is away too, their own delegate covers, and so on to
the first person present, at most ``CHAIN_MAX`` steps. Setting an away that would close a loop
(A covered by B while B is away and covered, directly or along the chain, by A) is refused, so the
chains in force never loop; a chain read anyway stops at a person met twice, at ``CHAIN_MAX``, and
at a delegate who no longer approves in the tenant — then nobody covers and what would go to the
away person stays with them.

``membership_away_set`` and ``membership_away_clear`` are the ledger's writes, audited
(``membership.away_set``, ``membership.away_cleared``); ``recovery.actions.away`` calls them and
hands over, in one transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Membership, Tenant

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# The furthest ahead an away may end: a longer absence is a change of role, not an away.
AWAY_MAX = timedelta(days=90)
# The most delegates a chain follows from the away person to the first one present.
CHAIN_MAX = 5
# The roles that may cover for someone: those that approve.
COVERING_ROLES = (Membership.Role.APPROVER, Membership.Role.ADMIN)


def away_q(*, now: datetime, prefix: str = "") -> Q:
    """Memberships whose person is away now (``prefix``: the path to the membership)."""
    return Q(**{f"{prefix}away_until__gt": now})


@dataclass(frozen=True)
class Cover:
    """Who covers for an away person now: ``delegate`` (the first person present along the chain)
    and ``chain``, the usernames from the away person to the delegate. ``until``: when the away
    person's away ends."""

    delegate: User
    chain: tuple[str, ...]
    until: datetime


def away_membership(*, tenant_id: int, user_id: int, now: datetime | None = None) -> Membership | None:
    """The person's membership of the tenant while they are away now (None when present)."""
    return (
        Membership.objects.select_related("away_delegate", "user")
        .filter(away_q(now=now or timezone.now()), tenant_id=tenant_id, user_id=user_id)
        .first()
    )


def cover_for(*, tenant_id: int, username: str, now: datetime | None = None) -> Cover | None:
    """Who covers now for ``username`` in the tenant (``Cover``), or None: they are present, or
    nobody along their chain can (a loop, more than ``CHAIN_MAX`` steps, a delegate who is no longer
    an active approver or admin of the tenant)."""
    now = now or timezone.now()
    first = (
        Membership.objects.select_related("user", "away_delegate")
        .filter(away_q(now=now), tenant_id=tenant_id, user__username=username)
        .first()
    )
    if first is None or first.away_until is None:
        return None
    chain = [username]
    membership = first
    for _step in range(CHAIN_MAX):
        delegate = membership.away_delegate
        if delegate is None or not delegate.is_active or delegate.get_username() in chain:
            return None
        next_membership = (
            Membership.objects.select_related("user", "away_delegate")
            .filter(tenant_id=tenant_id, user=delegate, role__in=COVERING_ROLES)
            .first()
        )
        if next_membership is None:
            return None
        chain.append(delegate.get_username())
        if next_membership.away_until is None or next_membership.away_until <= now:
            return Cover(delegate=delegate, chain=tuple(chain), until=first.away_until)
        membership = next_membership
    return None


def _refuse(message: str, field: str, code: str) -> errors.ValidationFailed:
    return errors.ValidationFailed(message, details={field: code}, code=f"away_{code}")


def _same_person(user: User, other: User) -> bool:
    """Two accounts of one person: the same account, or the same e-mail address case aside (the
    rule of ``recovery.transitions.approvals.same_person``, which this layer cannot import)."""
    email, other_email = (user.email or "").strip().lower(), (other.email or "").strip().lower()
    return user.pk == other.pk or bool(email and email == other_email)


def _lock_tenant_aways(tenant: Tenant) -> None:
    """Serialize the away changes of one tenant, so two people naming each other at once cannot
    both pass the loop check."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"away:{tenant.pk}"])


def membership_away_set(
    *, user: User, tenant: Tenant, until: datetime, delegate: User, actor: Actor, now: datetime | None = None
) -> Membership:
    """``user`` is away from ``tenant`` until ``until``, covered by ``delegate``; audited
    (``membership.away_set``: until, delegate, and the one it replaces). Refused (422, nothing
    changed): ``user`` not an approver or admin of the tenant, ``until`` not in the future or more
    than ``AWAY_MAX`` ahead, ``delegate`` themselves (or another account of theirs), not an active
    approver or admin of the same tenant, or covered by ``user`` along their chain (a loop). The
    caller holds the transaction."""
    now = now or timezone.now()
    _lock_tenant_aways(tenant)
    membership = Membership.objects.select_for_update().filter(user=user, tenant=tenant).first()
    if membership is None or membership.role not in COVERING_ROLES:
        raise errors.Forbidden(
            f"Only an approver or admin of {tenant.slug} sets an away there: nothing goes to "
            "anyone else to cover.",
            details={"tenant": tenant.slug},
        )
    if until <= now:
        raise _refuse("away until must be in the future.", "away_until", "past")
    if until > now + AWAY_MAX:
        raise _refuse(
            f"away until may be at most {AWAY_MAX.days} days ahead; a longer absence is a change of role.",
            "away_until",
            "too_far",
        )
    if _same_person(user, delegate):
        raise _refuse(
            "The delegate must be someone else: you cannot cover for yourself (nor can another "
            "account of yours).",
            "delegate",
            "self",
        )
    covering = (
        Membership.objects.select_related("away_delegate")
        .filter(tenant=tenant, user=delegate, user__is_active=True)
        .first()
    )
    if covering is None or covering.role not in COVERING_ROLES:
        raise _refuse(
            f"{delegate.get_username()} is not an active approver or admin of {tenant.slug}, so they "
            "cannot cover for you: choose one of its approvers.",
            "delegate",
            "not_approver",
        )
    if loop := _loop_through(tenant=tenant, start=covering, back_to=user, now=now):
        raise _refuse(
            f"{delegate.get_username()} is away and covered by {' → '.join(loop)}: naming them would "
            "make a loop in which nobody covers. Choose someone present, or ask them to change theirs.",
            "delegate",
            "loop",
        )
    previous = (
        {
            "away_until": membership.away_until.isoformat(),
            "delegate": membership.away_delegate.get_username() if membership.away_delegate else None,
        }
        if membership.away_until is not None and membership.away_until > now
        else None
    )
    membership.away_until, membership.away_delegate, membership.away_since = until, delegate, now
    membership.save(update_fields=["away_until", "away_delegate", "away_since"])
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="membership.away_set",
        subject=membership,
        data={
            "user": user.get_username(),
            "away_until": until.isoformat(),
            "delegate": delegate.get_username(),
            **({"replaces": previous} if previous else {}),
        },
    )
    return membership


def _loop_through(*, tenant: Tenant, start: Membership, back_to: User, now: datetime) -> list[str]:
    """The chain from ``start`` (the delegate) over the people away now that reaches ``back_to``
    (their usernames), or [] when it does not. Followed to its end, however long (each person
    once): a loop longer than ``CHAIN_MAX`` is a loop too."""
    chain: list[str] = []
    membership: Membership | None = start
    seen: set[int] = set()
    while membership is not None and membership.user_id not in seen:
        seen.add(membership.user_id)
        if membership.away_until is None or membership.away_until <= now or membership.away_delegate is None:
            return []
        delegate = membership.away_delegate
        chain.append(delegate.get_username())
        if delegate.pk == back_to.pk:
            return chain
        membership = (
            Membership.objects.select_related("away_delegate").filter(tenant=tenant, user=delegate).first()
        )
    return []


def membership_away_clear(
    *, user: User, tenant: Tenant, actor: Actor, now: datetime | None = None
) -> Membership | None:
    """``user`` is back in ``tenant`` before their away ends; audited (``membership.away_cleared``).
    None when they were not away (nothing changed, nothing audited). What was handed over stays
    with the delegate, and they may decide it too. The caller holds the transaction."""
    now = now or timezone.now()
    _lock_tenant_aways(tenant)
    membership = (
        Membership.objects.select_for_update(of=("self",))
        .filter(away_q(now=now), user=user, tenant=tenant)
        .select_related("away_delegate")
        .first()
    )
    if membership is None or membership.away_until is None:
        return None
    was = {
        "away_until": membership.away_until.isoformat(),
        "delegate": membership.away_delegate.get_username() if membership.away_delegate else None,
    }
    membership.away_until, membership.away_delegate, membership.away_since = None, None, None
    membership.save(update_fields=["away_until", "away_delegate", "away_since"])
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="membership.away_cleared",
        subject=membership,
        data={"user": user.get_username(), "was": was},
    )
    return membership
