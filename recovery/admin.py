"""Django admin for the decisions: read-only windows onto recovery items, unwinds, approvals and
agent commands. Decisions are taken in the dashboard or the operator API, whose services audit
them and enqueue the work; an edit here would do neither, so there is none."""

from __future__ import annotations

from django.contrib import admin

from ledger.admin import BigTableAdmin, ReadOnlyAdmin, tenant_filter
from recovery.models import AgentCommand, Approval, ApprovalGrant, RecoveryItem, Unwind, UnwindStep


@admin.register(RecoveryItem)
class RecoveryItemAdmin(BigTableAdmin):
    list_display = [
        "id",
        "run",
        "tenant",
        "status",
        "reason",
        "risk",
        "suggested_resolution",
        "resolution",
        "opened_at",
        "resolved_at",
    ]
    list_filter = ["status", "reason", "risk", tenant_filter("tenant")]
    search_fields = ["=id", "=run__id", "=signature"]
    list_select_related = ["tenant"]
    raw_id_fields = ["run", "failed_action", "assignee", "claimed_by", "resolved_by"]


# Shown and read-only alike; a tuple types as both (see ledger.admin's ActionInline).
_STEP_INLINE_FIELDS = (
    "position",
    "action",
    "tool",
    "strategy",
    "status",
    "attempts",
    "requires_approval",
    "error",
)


# Not subscriptable at runtime without django_stubs_ext.monkeypatch() (see ledger.admin).
class UnwindStepInline(admin.TabularInline):  # type: ignore[type-arg]
    model = UnwindStep
    fields = _STEP_INLINE_FIELDS
    readonly_fields = _STEP_INLINE_FIELDS
    can_delete = False
    show_change_link = True
    extra = 0
    max_num = 0
    ordering = ["position"]


@admin.register(Unwind)
class UnwindAdmin(BigTableAdmin):
    list_display = ["id", "run", "tenant", "status", "automatic", "on_failure", "created_at", "finished_at"]
    list_filter = ["status", "automatic", tenant_filter("tenant")]
    search_fields = ["=id", "=run__id"]
    list_select_related = ["tenant"]
    raw_id_fields = ["run", "item", "requested_by", "requested_by_key"]
    inlines = [UnwindStepInline]


@admin.register(UnwindStep)
class UnwindStepAdmin(BigTableAdmin):
    tenant_field = "unwind__tenant"
    list_display = [
        "id",
        "unwind",
        "position",
        "tool",
        "strategy",
        "status",
        "attempts",
        "lease_expires_at",
        "finished_at",
    ]
    list_filter = ["status", "strategy"]
    search_fields = ["=id", "=unwind__id", "=action__id", "=job_id"]
    raw_id_fields = ["unwind", "action"]


@admin.register(Approval)
class ApprovalAdmin(BigTableAdmin):
    list_display = [
        "id",
        "kind",
        "tool",
        "tenant",
        "risk",
        "status",
        "approvers_required",
        "created_at",
        "expires_at",
        "decided_at",
    ]
    list_filter = ["status", "kind", "risk", tenant_filter("tenant")]
    search_fields = ["=id", "=run__id", "=action__id"]
    list_select_related = ["tenant"]
    raw_id_fields = [
        "run",
        "action",
        "step",
        "requested_by",
        "requested_by_key",
        "decided_by",
        "decided_by_key",
    ]


@admin.register(ApprovalGrant)
class ApprovalGrantAdmin(ReadOnlyAdmin):
    tenant_field = "approval__tenant"
    show_full_result_count = False
    list_display = ["approval", "label", "created_at"]
    search_fields = ["=approval__id"]
    list_select_related = ["approval"]
    raw_id_fields = ["approval", "user", "key"]


@admin.register(AgentCommand)
class AgentCommandAdmin(ReadOnlyAdmin):
    show_full_result_count = False
    list_display = ["id", "run", "tenant", "kind", "status", "created_at", "acked_at", "delivered_at"]
    list_filter = ["kind", "status", tenant_filter("tenant")]
    search_fields = ["=id", "=run__id"]
    list_select_related = ["tenant"]
    raw_id_fields = ["run", "checkpoint", "created_by"]
