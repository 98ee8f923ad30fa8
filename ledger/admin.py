"""Django admin for the record.

The admin is a window, not a second way to change state: state fields are written only by the
services (which audit every change), so the record's models are read-only here, key revocation
and membership changes go through their services, and the audit log cannot be touched at all.

Tenant admins (``create_staff --role admin``) reach this admin without being superusers; every
list is scoped to the tenants they administer. The ledger holds millions of rows, so big tables
skip the full ``COUNT(*)``, search only on exact, indexed ids, and filter only on cheap columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import Q, QuerySet
from django.http import HttpRequest

from infra import errors
from ledger import staff
from ledger.audit import Actor
from ledger.audit_models import ArchivedRun, AuditSignCursor, SignedHead
from ledger.models import (
    Action,
    AgentKey,
    Checkpoint,
    Compensator,
    Event,
    IdempotencyRecord,
    Membership,
    Pause,
    PolicySet,
    PolicyStamp,
    Run,
    StateReader,
    Tenant,
    ToolPolicy,
)
from ledger.services import keys

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def admin_user(request: HttpRequest) -> User:
    """``request.user`` in an admin view, where it is always signed in: the admin site lets only
    active staff users reach any of its views (``AdminSite.has_permission``). An anonymous user
    here would mean a view was wired outside the admin site; refuse rather than act as nobody."""
    user = request.user
    if not user.is_authenticated:
        raise PermissionDenied("The admin is for signed-in staff users.")
    return user


def admin_tenant_ids(request: HttpRequest) -> list[int]:
    """The tenants a non-superuser administers (cached on the request)."""
    cached = getattr(request, "_saga_admin_tenant_ids", None)
    if cached is None:
        cached = list(
            Membership.objects.filter(user=admin_user(request), role=Membership.Role.ADMIN).values_list(
                "tenant_id", flat=True
            )
        )
        request._saga_admin_tenant_ids = cached  # type: ignore[attr-defined]
    return cached


class TenantListFilter(admin.SimpleListFilter):
    """Tenant filter listing only the tenants the user may see (a plain FK filter would list every
    tenant's name to every admin)."""

    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> list[tuple[str, str]]:
        tenants = Tenant.objects.order_by("slug")
        if not request.user.is_superuser:
            tenants = tenants.filter(pk__in=admin_tenant_ids(request))
        return [(str(t.pk), t.slug) for t in tenants]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value():
            return queryset.filter(**{f"{getattr(self, 'tenant_field', 'tenant')}_id": self.value()})
        return queryset


def tenant_filter(path: str) -> type[TenantListFilter]:
    return type(f"TenantListFilter_{path}", (TenantListFilter,), {"tenant_field": path})


# The admin classes are not subscriptable at runtime (that takes django_stubs_ext.monkeypatch(),
# a dev-only package), so they are subclassed without their model type parameter.
class TenantScopedAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Superusers see everything; anyone else only the rows of the tenants they administer."""

    tenant_field = "tenant"
    # Django 6's default for scheme-less URLs, adopted now (and it silences 5.2's warning).
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    # Rows with no tenant (global policies) are visible to every tenant admin: they apply to them.
    include_global = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        scope = Q(**{f"{self.tenant_field}__in": admin_tenant_ids(request)})
        if self.include_global:
            scope |= Q(**{f"{self.tenant_field}__isnull": True})
        return queryset.filter(scope)


class ReadOnlyAdmin(TenantScopedAdmin):
    """For rows only services may write: viewable, never added, changed or deleted here."""

    def has_add_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: models.Model | None = None) -> bool:
        return False


class BigTableAdmin(ReadOnlyAdmin):
    # COUNT(*) over millions of rows on every page view is the admin's classic cost.
    show_full_result_count = False
    list_per_page = 50


@admin.register(Tenant)
class TenantAdmin(TenantScopedAdmin):
    tenant_field = "pk"
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    readonly_fields = ["created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Tenant | None = None) -> bool:
        # A tenant's audit events are protected; deleting one is a database job, not a click.
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Tenant | None = None) -> list[str]:
        # The slug is in keys' tenants, URLs and scripts: fixed once created.
        return ["slug", "created_at"] if obj else ["created_at"]


@admin.register(Membership)
class MembershipAdmin(TenantScopedAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", tenant_filter("tenant")]
    search_fields = ["user__username", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]
    list_select_related = ["user", "tenant"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Membership | None = None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Membership | None = None) -> bool:
        return request.user.is_superuser

    def get_readonly_fields(self, request: HttpRequest, obj: Membership | None = None) -> list[str]:
        # Away is the person's own, set on the dashboard's away page (``ledger.away``): shown here, never edited.
        away = ["away_until", "away_delegate", "away_since"]
        return ["user", "tenant", "created_at", *away] if obj else ["created_at", *away]

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        # Through the service: it audits the role change and keeps is_staff in step with it.
        saved = staff.membership_set(
            user=obj.user, tenant=obj.tenant, role=obj.role, actor=Actor.for_user(admin_user(request))
        )
        obj.pk, obj.created_at = saved.pk, saved.created_at

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        staff.membership_remove(membership=obj, actor=Actor.for_user(admin_user(request)))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        for membership in queryset.select_related("user", "tenant"):
            staff.membership_remove(membership=membership, actor=Actor.for_user(admin_user(request)))


@admin.register(AgentKey)
class AgentKeyAdmin(TenantScopedAdmin):
    list_display = ["prefix", "name", "tenant", "scopes", "owner", "created_at", "last_used_at", "revoked_at"]
    list_filter = [tenant_filter("tenant"), ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["=prefix", "name"]
    list_select_related = ["tenant", "owner"]
    # The hash never leaves the database through the admin, not even read-only.
    exclude = ["key_hash"]
    # The owner too: a key's owner is set once, by the commands (``keys.agent_key_set_owner``),
    # never by a tenant admin, who may not make a key approve as someone else.
    readonly_fields = [
        "id",
        "tenant",
        "name",
        "prefix",
        "scopes",
        "owner",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = ["revoke_keys"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Keys are issued by create_agent_key (or the dashboard), which shows the secret once.
        return False

    def has_change_permission(self, request: HttpRequest, obj: AgentKey | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AgentKey | None = None) -> bool:
        # Revoke instead: a deleted key would orphan the audit trail of what it did.
        return False

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.change_agentkey")

    @admin.action(description="Revoke selected keys", permissions=["revoke"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[AgentKey]) -> None:
        revoked, skipped = [], []
        for key in queryset.select_related("tenant"):
            try:
                keys.agent_key_revoke(key=key, actor=Actor.for_user(admin_user(request)))
                revoked.append(key.prefix)
            except errors.InvalidTransition:
                skipped.append(key.prefix)
        if revoked:
            self.message_user(
                request, f"Revoked {len(revoked)} key(s): {', '.join(revoked)}.", messages.SUCCESS
            )
        if skipped:
            self.message_user(request, f"Already revoked: {', '.join(skipped)}.", messages.WARNING)


# Shown and read-only alike. A tuple: it types as both `fields` and `readonly_fields` (a list is
# invariant, so one list cannot be both).
_ACTION_INLINE_FIELDS = (
    "seq",
    "tool",
    "target_id",
    "status",
    "risk",
    "action_class",
    "attempts",
    "completion_seq",
)


class ActionInline(admin.TabularInline):  # type: ignore[type-arg]  # see TenantScopedAdmin
    model = Action
    fields = _ACTION_INLINE_FIELDS
    readonly_fields = _ACTION_INLINE_FIELDS
    show_change_link = True
    can_delete = False
    extra = 0
    max_num = 0
    ordering = ["seq"]


@admin.register(Run)
class RunAdmin(BigTableAdmin):
    list_display = ["id", "tenant", "agent", "status", "failure_reason", "created_at", "finished_at"]
    list_filter = ["status", tenant_filter("tenant")]
    search_fields = ["=id", "=external_id"]
    list_select_related = ["tenant"]
    raw_id_fields = ["failed_action", "created_by_key"]
    inlines = [ActionInline]


@admin.register(Action)
class ActionAdmin(BigTableAdmin):
    list_display = [
        "id",
        "run",
        "seq",
        "tool",
        "target_id",
        "status",
        "risk",
        "action_class",
        "attempts",
        "created_at",
    ]
    list_filter = ["status", "risk", "action_class", tenant_filter("tenant")]
    search_fields = ["=id", "=run__id", "=idempotency_key", "=target_id"]
    list_select_related = ["run"]
    raw_id_fields = ["run"]


@admin.register(Checkpoint)
class CheckpointAdmin(BigTableAdmin):
    list_display = ["id", "run", "name", "recovery_mode", "requires_user_approval", "created_at"]
    list_filter = ["recovery_mode", tenant_filter("tenant")]
    search_fields = ["=id", "=run__id"]
    raw_id_fields = ["run"]


@admin.register(PolicySet)
class PolicySetAdmin(ReadOnlyAdmin):
    # Loaded by load_policies, which replaces a scope wholesale: an edit here would be silently
    # undone by the next load, so these are shown, not edited.
    include_global = True
    list_display = ["__str__", "source", "content_hash", "loaded_at"]


@admin.register(PolicyStamp)
class PolicyStampAdmin(ReadOnlyAdmin):
    """The tool-policy stamp, which a database trigger moves. Not a tenant's row, so superusers
    only (who are never tenant-filtered, so the tenant scoping never applies to it)."""

    def has_view_permission(self, request: HttpRequest, obj: PolicyStamp | None = None) -> bool:
        return bool(request.user.is_superuser)


@admin.register(Pause)
class PauseAdmin(ReadOnlyAdmin):
    """Read-only: pausing and lifting go through ``ledger.services.pauses`` (the dashboard's Pauses
    page, the API), which audits who and why."""

    list_display = ["id", "tenant", "agent", "tool", "reason", "created_at", "lifted_at"]
    list_filter = [tenant_filter("tenant")]
    search_fields = ["agent", "tool", "reason"]
    list_select_related = ["tenant"]


@admin.register(ToolPolicy)
class ToolPolicyAdmin(ReadOnlyAdmin):
    include_global = True
    list_display = [
        "tool",
        "tenant",
        "risk",
        "approval",
        "action_class",
        "compensation",
        "compensation_tool",
        "approvers",
        "source",
        "loaded_at",
    ]
    list_filter = ["risk", "approval", "action_class", "compensation", tenant_filter("tenant")]
    search_fields = ["tool"]
    list_select_related = ["tenant"]


@admin.register(Compensator)
class CompensatorAdmin(ReadOnlyAdmin):
    include_global = True
    list_display = [
        "tool",
        "tenant",
        "kind",
        "url",
        "mcp_tool",
        "python_path",
        "secret_status",
        "source",
        "loaded_at",
    ]
    list_filter = ["kind", tenant_filter("tenant")]
    search_fields = ["tool"]
    list_select_related = ["tenant"]
    # The literal secret signs webhook calls; the admin shows whether one is configured, never it.
    exclude = ["secret"]
    readonly_fields = ["secret_status"]

    @admin.display(description="secret")
    def secret_status(self, obj: Compensator) -> str:
        if obj.headers_env:
            return "headers from " + ", ".join(f"${env}" for env in obj.headers_env.values())
        if obj.secret_env:
            return f"from ${obj.secret_env}"
        return "set (hidden)" if obj.secret else "—"


@admin.register(StateReader)
class StateReaderAdmin(CompensatorAdmin):
    """The policy files' ``readers``: shown as compensators are, their secrets never."""


@admin.register(IdempotencyRecord)
class IdempotencyRecordAdmin(BigTableAdmin):
    list_display = ["key", "tenant", "method", "path", "state", "response_status", "created_at"]
    list_filter = ["state"]
    search_fields = ["=key"]
    list_select_related = ["tenant"]


@admin.register(Event)
class EventAdmin(BigTableAdmin):
    """The audit log: append-only in the database (a trigger), and read-only here."""

    list_display = [
        "id",
        "created_at",
        "tenant",
        "kind",
        "subject_type",
        "subject_id",
        "from_state",
        "to_state",
        "actor_type",
        "actor_label",
    ]
    list_filter = ["actor_type", tenant_filter("tenant")]
    search_fields = ["=run__id", "=subject_id", "=chain"]
    list_select_related = ["tenant"]
    raw_id_fields = ["run"]
    ordering = ["-id"]
    actions = None

    def get_readonly_fields(self, request: HttpRequest, obj: Event | None = None) -> list[str]:
        return [f.name for f in Event._meta.fields]


@admin.register(SignedHead)
class SignedHeadAdmin(BigTableAdmin):
    """The worker's signed chain heads (ledger.audit_signing): append-only, shown, never edited."""

    list_display = ["chain", "position", "reason", "key_id", "signed_at"]
    list_filter = ["reason"]
    search_fields = ["chain"]


@admin.register(ArchivedRun)
class ArchivedRunAdmin(BigTableAdmin):
    """The runs retention moved to their archive: append-only, shown, never edited."""

    list_display = ["run_id", "tenant", "agent", "status", "finished_at", "archived_at"]
    list_filter = ["status"]
    search_fields = ["run_id"]


@admin.register(AuditSignCursor)
class AuditSignCursorAdmin(ReadOnlyAdmin):
    """Where the signing pass of each tenant stands."""

    list_display = ["tenant", "signed_at"]
