"""Dashboard staff: users, their one role per tenant, and the Django admin access that follows
from being a tenant admin somewhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Membership, Tenant

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# Tenant admins reach the Django admin through this group: view rights on the record and the
# decisions, plus revoking keys. The admin itself scopes every list to their tenants.
TENANT_ADMIN_GROUP = "Saga tenant admins"


def _tenant_admin_group() -> Group:
    group, _ = Group.objects.get_or_create(name=TENANT_ADMIN_GROUP)
    wanted = Permission.objects.filter(
        content_type__app_label__in=["ledger", "recovery"], codename__startswith="view_"
    )
    wanted = wanted | Permission.objects.filter(content_type__app_label="ledger", codename="change_agentkey")
    # Notification settings and audit stream sinks are the tenant admin's own (scoped to their tenants).
    wanted = (
        wanted
        | Permission.objects.filter(
            content_type__app_label="recovery",
            content_type__model__in=["notificationchannel", "slackapp", "slackuserlink"],
        )
        | Permission.objects.filter(content_type__app_label="audit_stream", content_type__model="auditsink")
    )
    group.permissions.set(wanted)
    return group


@transaction.atomic
def membership_set(*, user: User, tenant: Tenant, role: str, actor: Actor) -> Membership:
    """Give ``user`` exactly ``role`` in ``tenant`` (one role per tenant), and Django admin access
    exactly while they are an admin somewhere."""
    if role not in Membership.Role.values:
        raise errors.ValidationFailed(
            f"role must be one of {', '.join(Membership.Role.values)}.", details={"role": role}
        )
    membership = Membership.objects.select_for_update().filter(user=user, tenant=tenant).first()
    previous = membership.role if membership else ""
    if membership is None:
        membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    elif membership.role != role:
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.role = role
    if previous != role:
        audit_record(
            tenant=tenant,
            actor=actor,
            kind="membership.set",
            subject=membership,
            from_state=previous,
            to_state=role,
            data={"user": user.get_username()},
        )
    _sync_staff_access(user)
    return membership


def _sync_staff_access(user: User) -> None:
    is_admin = Membership.objects.filter(user=user, role=Membership.Role.ADMIN).exists()
    group = _tenant_admin_group()
    if is_admin:
        user.groups.add(group)
    else:
        user.groups.remove(group)
    staff = is_admin or user.is_superuser
    if user.is_staff != staff:
        user.is_staff = staff
        user.save(update_fields=["is_staff"])


@transaction.atomic
def membership_remove(*, membership: Membership, actor: Actor) -> None:
    """Take a user out of a tenant (and out of the Django admin if that was their last admin role)."""
    user, tenant, role = membership.user, membership.tenant, membership.role
    if Membership.objects.filter(pk=membership.pk).delete()[0] != 1:
        raise errors.NotFound.for_id("Membership", str(membership.pk))
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="membership.removed",
        subject=f"membership:{membership.pk}",
        from_state=role,
        data={"user": user.get_username()},
    )
    _sync_staff_access(user)


@dataclass(frozen=True)
class StaffResult:
    user: User
    membership: Membership
    user_created: bool


@transaction.atomic
def staff_set(
    *, username: str, password: str, tenant: Tenant, role: str, actor: Actor, email: str = ""
) -> StaffResult:
    """Create or update a dashboard user: set the password and the role in ``tenant``."""
    username = username.strip()
    if not username:
        raise errors.ValidationFailed("A username is required.", details={"username": "required"})
    user_model = get_user_model()
    user = user_model.objects.select_for_update().filter(username=username).first()
    if user is not None and not user.has_usable_password():
        # Someone who signs in only through the identity provider (single sign-on) and whose
        # username their provider account chose: a password and a role given here by name could
        # land on whoever took that name first. Their roles come from the provider's groups.
        raise errors.Conflict(
            f"The user {username} signs in through single sign-on and has no password here; their "
            "roles come from the identity provider's groups (docs/OPERATIONS.md). Grant a role by "
            "the provider, or in the Django admin on that exact account.",
            details={"username": username},
            code="sso_user",
        )
    created = user is None
    if user is None:
        user = user_model(username=username, email=email)
    elif email:
        user.email = email
    try:
        validate_password(password, user=user)
    except DjangoValidationError as exc:
        raise errors.ValidationFailed(
            "The password is too weak: " + " ".join(exc.messages), details={"password": exc.messages}
        ) from None
    user.set_password(password)
    user.save()
    membership = membership_set(user=user, tenant=tenant, role=role, actor=actor)
    user.refresh_from_db()
    return StaffResult(user=user, membership=membership, user_created=created)
