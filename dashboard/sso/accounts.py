"""A sign-in through the identity provider, on our side: the one Django user of the provider's
account (issuer + ``sub``), its profile refreshed, and the memberships single sign-on manages set
to what the claim says now (added, changed, removed), each change audited as any role change is
(``ledger.staff``). Runs in one transaction: two sign-ins of one account at once make one user."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboard.models import SsoIdentity, SsoMembership
from ledger.audit import Actor
from ledger.models import Membership, Tenant
from ledger.staff import membership_remove, membership_set

if TYPE_CHECKING:
    from django.contrib.auth.models import User

log = structlog.get_logger(__name__)

_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]")
_USERNAME_MAX = 140  # the user model's 150, less room for a "-NN" suffix
# Usernames tried for one first sign-in: each lost only to a concurrent sign-in that took it.
_NAME_ATTEMPTS = 5


class NoFreeUsername(Exception):
    """Every username chosen for a first sign-in was taken meanwhile by concurrent sign-ins: the
    sign-in fails (and can be tried again), as any refused sign-in does."""


@dataclass(frozen=True)
class Profile:
    """What the provider says about the person, shown here (never used to find them)."""

    preferred_username: str = ""
    email: str = ""
    first_name: str = ""
    last_name: str = ""


@dataclass
class SignIn:
    user: User
    created: bool
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # Tenants the claim names that do not exist here (a claim never creates a tenant).
    unknown_tenants: list[str] = field(default_factory=list)
    # Tenants where the person holds a role granted here by hand, which the claim does not change.
    kept_local: list[str] = field(default_factory=list)


def sso_actor(issuer: str) -> Actor:
    return Actor.system(f"sso {issuer}"[:200])


@transaction.atomic
def sso_sign_in(*, issuer: str, subject: str, profile: Profile, wanted: dict[str, str]) -> SignIn:
    """The user of (``issuer``, ``subject``), created on first sign-in, with the memberships
    single sign-on manages set to ``wanted`` (tenant slug → role)."""
    identity = (
        SsoIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=issuer, subject=subject)
        .first()
    )
    created = identity is None
    if identity is None:
        identity = _create_identity(issuer=issuer, subject=subject, profile=profile)
    user = identity.user
    _refresh_profile(user, profile)
    SsoIdentity.objects.filter(pk=identity.pk).update(last_sign_in_at=timezone.now())
    result = SignIn(user=user, created=created)
    _sync_memberships(result, wanted=wanted, actor=sso_actor(issuer))
    return result


def _create_identity(*, issuer: str, subject: str, profile: Profile) -> SsoIdentity:
    """The identity and its new user. Two first sign-ins can race: of the same account (in two
    tabs or processes), when the other one's identity is the answer; or of two accounts the same
    free username was chosen for, when this one takes the next free name."""
    user_model = get_user_model()
    for _ in range(_NAME_ATTEMPTS):
        try:
            with transaction.atomic():
                user = user_model(username=_free_username(profile), email=profile.email[:254])
                user.first_name = profile.first_name[:150]
                user.last_name = profile.last_name[:150]
                # Signs in through the provider only: no password here can ever match.
                user.set_unusable_password()
                user.save()
                return SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        except IntegrityError:
            existing = (
                SsoIdentity.objects.select_for_update()
                .select_related("user")
                .filter(issuer=issuer, subject=subject)
                .first()
            )
            if existing is not None:
                return existing
            # Another account's first sign-in took the name meanwhile: choose again.
    raise NoFreeUsername(f"no free username for a new single sign-on account after {_NAME_ATTEMPTS} tries")


def _free_username(profile: Profile) -> str:
    """A readable username (shown on decisions and in the audit log), never one already taken:
    the identity, not the name, says who someone is, so a name that collides gets a suffix."""
    base = profile.preferred_username or profile.email.partition("@")[0] or "sso-user"
    base = _USERNAME_UNSAFE.sub("-", base.strip())[:_USERNAME_MAX] or "sso-user"
    taken = set(get_user_model().objects.filter(username__startswith=base).values_list("username", flat=True))
    if base not in taken:
        return base
    number = 2
    while f"{base}-{number}" in taken:
        number += 1
    return f"{base}-{number}"


def _refresh_profile(user: User, profile: Profile) -> None:
    wanted = {
        "email": profile.email[:254],
        "first_name": profile.first_name[:150],
        "last_name": profile.last_name[:150],
    }
    changed = [name for name, value in wanted.items() if getattr(user, name) != value]
    for name in changed:
        setattr(user, name, wanted[name])
    if changed:
        user.save(update_fields=changed)


def _sync_memberships(result: SignIn, *, wanted: dict[str, str], actor: Actor) -> None:
    user = result.user
    tenants = {tenant.slug: tenant for tenant in Tenant.objects.filter(slug__in=list(wanted))}
    result.unknown_tenants = sorted(set(wanted) - set(tenants))
    for slug in result.unknown_tenants:
        log.warning("sso.unknown_tenant", tenant=slug, user=user.get_username())
    current = {
        membership.tenant.slug: membership
        for membership in Membership.objects.select_for_update().filter(user=user).select_related("tenant")
    }
    managed = set(SsoMembership.objects.filter(membership__user=user).values_list("membership_id", flat=True))
    for slug, tenant in sorted(tenants.items()):
        role = wanted[slug]
        membership = current.get(slug)
        if membership is not None and membership.pk not in managed:
            if membership.role != role:
                log.info("sso.local_role_kept", tenant=slug, user=user.get_username(), role=membership.role)
            result.kept_local.append(slug)
            continue
        if membership is None:
            result.added.append(slug)
        elif membership.role != role:
            result.changed.append(slug)
        membership = membership_set(user=user, tenant=tenant, role=role, actor=actor)
        SsoMembership.objects.get_or_create(membership=membership)
    for slug, membership in sorted(current.items()):
        if membership.pk in managed and slug not in tenants:
            # The marker first: membership_remove counts exactly one row deleted.
            SsoMembership.objects.filter(membership=membership).delete()
            membership_remove(membership=membership, actor=actor)
            result.removed.append(slug)
