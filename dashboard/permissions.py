"""Who may do what, per tenant. A user's role in a tenant comes from ``ledger.Membership``;
each role grants a fixed set of capabilities. Views hide what a role may not use *and* check
again on the server (``require``), so a hand-crafted POST is refused with 403.

Tenant visibility is separate from capabilities: an object in a tenant the user has no
membership in is not found (404), never forbidden, so its existence does not leak. The tenants a
user sees are their memberships (a superuser's too): ``tenant_ids_for``, ``tenants_for`` (the
pickers) and ``reach_for``, the ``ledger.scoping.Reach`` every lookup on their behalf narrows to.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.http import Http404

from ledger.models import Membership, Tenant
from ledger.scoping import Reach


class Capability(enum.StrEnum):
    VIEW = "view"
    # Resume, compensate, close, retry/skip steps, reconcile unknown outcomes, bulk actions, assign.
    OPERATE = "operate"
    APPROVE = "approve"
    # The link to the Django admin (which scopes every list to the admin's tenants).
    ADMINISTER = "administer"


Role = Membership.Role

ROLE_CAPABILITIES: dict[str, frozenset[Capability]] = {
    Role.VIEWER: frozenset({Capability.VIEW}),
    Role.OPERATOR: frozenset({Capability.VIEW, Capability.OPERATE}),
    Role.APPROVER: frozenset({Capability.VIEW, Capability.APPROVE}),
    Role.ADMIN: frozenset(Capability),
}

_CACHE_ATTR = "_saga_roles"

# Who is asking: ``request.user``. Anonymous users have no role anywhere.
Someone: TypeAlias = User | AnonymousUser


def roles_for(user: Someone) -> dict[int, str]:
    """tenant id → role for this user, read once per request (cached on the user object)."""
    if not user.is_authenticated or not isinstance(user, User):  # (the second narrows the type)
        return {}
    cached: dict[int, str] | None = getattr(user, _CACHE_ATTR, None)
    if cached is None:
        cached = dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
        setattr(user, _CACHE_ATTR, cached)
    return cached


def tenant_ids_for(user: Someone) -> list[int]:
    return sorted(roles_for(user))


def tenants_for(user: Someone) -> list[Tenant]:
    """The tenants a user sees, by slug (the tenant pickers of the queue, insights, policies and
    pauses pages)."""
    return list(Tenant.objects.filter(pk__in=tenant_ids_for(user)).order_by("slug"))


def reach_for(user: Someone) -> Reach:
    return Reach.of_tenants(tenant_ids_for(user))


def can(user: Someone, capability: Capability, tenant_id: int) -> bool:
    role = roles_for(user).get(tenant_id)
    return role is not None and capability in ROLE_CAPABILITIES[role]


def can_anywhere(user: Someone, capability: Capability) -> bool:
    return any(capability in ROLE_CAPABILITIES[role] for role in roles_for(user).values())


def tenant_ids_with(user: Someone, capability: Capability) -> list[int]:
    return sorted(tid for tid, role in roles_for(user).items() if capability in ROLE_CAPABILITIES[role])


def can_see_workers(user: Someone) -> bool:
    """The RQ dashboard (``/django-rq/``) shows every tenant's jobs with their arguments and can
    delete or requeue them: superusers only. A tenant admin is staff (for their tenants' slice of
    the Django admin), which is all django-rq itself would ask for."""
    return user.is_authenticated and user.is_active and user.is_superuser


def require(user: Someone, capability: Capability, tenant_id: int) -> None:
    if not can(user, capability, tenant_id):
        raise PermissionDenied(f"Your role does not allow this ({capability}).")


def require_tenant(
    user: Someone, capability: Capability, *, slug: str | None = None, pk: int | None = None
) -> Tenant:
    """The tenant named by ``slug`` or ``pk`` for a user who has ``capability`` there: one they are
    no member of is not found (404: its existence does not leak), one they see but may not do this
    in is forbidden (403)."""
    found = Tenant.objects.filter(pk__in=tenant_ids_for(user))
    tenant = (found.filter(slug=slug) if slug is not None else found.filter(pk=pk or 0)).first()
    if tenant is None:
        raise Http404("No such tenant.")
    require(user, capability, tenant.pk)
    return tenant


class TenantPermissions:
    """What the current user may do in one tenant, for templates: ``perms.operate``."""

    def __init__(self, user: Someone, tenant_id: int) -> None:
        self.user = user
        self.tenant_id = tenant_id

    @property
    def role(self) -> str:
        return roles_for(self.user).get(self.tenant_id, "")

    @property
    def operate(self) -> bool:
        return can(self.user, Capability.OPERATE, self.tenant_id)

    @property
    def approve(self) -> bool:
        return can(self.user, Capability.APPROVE, self.tenant_id)

    @property
    def administer(self) -> bool:
        return can(self.user, Capability.ADMINISTER, self.tenant_id)
