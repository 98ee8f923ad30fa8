"""Django admin for the decisions: read-only windows onto recovery items, unwinds, approvals,
agent commands and notifications. Decisions are taken in the dashboard or the operator API, whose
services audit them and enqueue the work; an edit here would do neither, so there is none.

Notification channels and the Slack app are settings, not decisions: tenant admins manage them
here as in the dashboard, through the same services (``recovery.actions.channels``). The Slack app's
signing secret can be replaced, never read back; Slack user links can be removed, never made."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from infra import errors
from ledger.admin import (
    BigTableAdmin,
    ReadOnlyAdmin,
    TenantScopedAdmin,
    admin_tenant_ids,
    admin_user,
    tenant_filter,
)
from ledger.audit import Actor
from ledger.models import Tenant
from recovery.actions import channels
from recovery.audit_stream import config as audit_stream
from recovery.audit_stream.models import AuditCursor, AuditSink
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.models import (
    AgentCommand,
    Approval,
    ApprovalGrant,
    CompensatorCheck,
    EmailLinkUse,
    Notification,
    NotificationChannel,
    RecoveryItem,
    SlackApp,
    SlackLinkCode,
    SlackUserLink,
    Unwind,
    UnwindStep,
)


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


@admin.register(EmailLinkUse)
class EmailLinkUseAdmin(ReadOnlyAdmin):
    """The e-mail decision links that were used: a link's nonce, whose decision, when."""

    tenant_field = "approval__tenant"
    show_full_result_count = False
    list_display = ["nonce", "approval", "user", "decision", "used_at"]
    search_fields = ["=approval__id", "=nonce"]
    list_select_related = ["approval", "user"]
    raw_id_fields = ["approval", "user"]


@admin.register(AgentCommand)
class AgentCommandAdmin(ReadOnlyAdmin):
    show_full_result_count = False
    list_display = ["id", "run", "tenant", "kind", "status", "created_at", "acked_at", "delivered_at"]
    list_filter = ["kind", "status", tenant_filter("tenant")]
    search_fields = ["=id", "=run__id"]
    list_select_related = ["tenant"]
    raw_id_fields = ["run", "checkpoint", "created_by"]


@admin.register(CompensatorCheck)
class CompensatorCheckAdmin(ReadOnlyAdmin):
    """The dashboard's compensator checks (recovery.compensator_checks): recorded by the service."""

    list_display = ["tool", "tenant", "ok", "checked_at", "checked_by"]
    list_filter = ["ok", tenant_filter("tenant")]
    search_fields = ["tool"]
    list_select_related = ["tenant", "checked_by"]
    raw_id_fields = ["checked_by"]


# --- Notifications: channels and the Slack app are the tenant admins' to manage ------------------


class _TenantChoiceMixin:
    """A tenant admin may only pick a tenant they administer."""

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "tenant" and not request.user.is_superuser:
            kwargs["queryset"] = Tenant.objects.filter(pk__in=admin_tenant_ids(request))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]


class NotificationChannelForm(forms.ModelForm):  # type: ignore[type-arg]
    """A channel's secret (a webhook's signing secret, a PagerDuty routing key) is write-only: the
    field is never filled in, and left blank it keeps the stored one."""

    class Meta:
        model = NotificationChannel
        fields = ["tenant", "name", "kind", "target", "secret", "events", "min_risk", "enabled"]
        widgets = {"secret": forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"})}
        help_texts = {
            "secret": "Write-only. Webhooks: blank generates one (or keeps the current one). "
            "PagerDuty: the routing key (blank keeps the current one)."
        }

    def clean_secret(self) -> str:
        secret = str(self.cleaned_data.get("secret") or "")
        if not secret and self.instance.pk:
            stored = NotificationChannel.objects.filter(pk=self.instance.pk).values_list("secret", flat=True)
            return stored.first() or ""
        return secret


@admin.register(NotificationChannel)
class NotificationChannelAdmin(_TenantChoiceMixin, TenantScopedAdmin):
    """Saved through ``recovery.actions.channels`` (audited); the model's ``clean`` checks the destination
    (e-mail addresses, a URL the outbound guard accepts, a PagerDuty routing key) and the form shows
    its refusal."""

    form = NotificationChannelForm
    list_display = ["name", "tenant", "kind", "min_risk", "enabled", "updated_at"]
    list_filter = ["kind", "enabled", tenant_filter("tenant")]
    search_fields = ["name"]
    list_select_related = ["tenant"]
    fields = ["tenant", "name", "kind", "target", "secret", "events", "min_risk", "enabled"]

    def save_model(self, request: HttpRequest, obj: NotificationChannel, form: Any, change: bool) -> None:
        actor = Actor.for_user(admin_user(request))
        settings = {name: getattr(obj, name) for name in channels.EDITABLE}
        if change:
            saved = channels.channel_update(channel=obj, actor=actor, **settings)
        else:
            saved = channels.channel_create(tenant=obj.tenant, actor=actor, **settings)
        obj.pk = saved.channel.pk
        if saved.generated_secret:
            messages.info(request, f"Generated webhook secret (shown once): {saved.generated_secret}")

    def delete_model(self, request: HttpRequest, obj: NotificationChannel) -> None:
        channels.channel_delete(channel=obj, actor=Actor.for_user(admin_user(request)))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[NotificationChannel]) -> None:
        for channel in queryset.select_related("tenant"):
            channels.channel_delete(channel=channel, actor=Actor.for_user(admin_user(request)))


@admin.register(Notification)
class NotificationAdmin(BigTableAdmin):
    list_display = [
        "id",
        "tenant",
        "event",
        "channel_name",
        "status",
        "attempts",
        "created_at",
        "delivered_at",
    ]
    list_filter = ["status", "event", tenant_filter("tenant")]
    search_fields = ["=id", "=subject_id", "=run_id"]
    list_select_related = ["tenant"]
    raw_id_fields = ["channel"]


class SlackAppAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """The signing secret is write-only: the form has a field to enter a new one, never one that
    holds (and so renders) the current one."""

    new_signing_secret = forms.CharField(
        label="New signing secret",
        required=False,
        max_length=200,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The Slack app's Signing Secret (Basic Information → App Credentials). It is never "
        "shown again; leave blank to keep the current one.",
    )

    class Meta:
        model = SlackApp
        fields = ["tenant"]

    def clean_new_signing_secret(self) -> str:
        secret: str = self.cleaned_data.get("new_signing_secret", "")
        if not secret and self.instance.pk is None:
            raise forms.ValidationError("A new Slack app needs its signing secret.")
        if secret:
            try:
                return channels.slack_signing_secret_checked(secret)
            except errors.ValidationFailed as exc:
                raise forms.ValidationError(exc.message) from None
        return secret


@admin.register(SlackApp)
class SlackAppAdmin(_TenantChoiceMixin, TenantScopedAdmin):
    form = SlackAppAdminForm
    list_display = ["tenant", "updated_at"]
    fields = ["tenant", "new_signing_secret"]

    def get_fields(self, request: HttpRequest, obj: SlackApp | None = None) -> Any:
        # Someone who may only view it sees the tenant: the secret field is for entering one.
        if obj is None or self.has_change_permission(request, obj):
            return ["tenant", "new_signing_secret"]
        return ["tenant"]

    def get_readonly_fields(self, request: HttpRequest, obj: SlackApp | None = None) -> list[str]:
        return ["tenant"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: SlackApp, form: Any, change: bool) -> None:
        secret = form.cleaned_data.get("new_signing_secret", "")
        if not secret:
            return  # nothing to change: the current secret stays
        saved = channels.slack_app_set(
            tenant=obj.tenant, actor=Actor.for_user(admin_user(request)), signing_secret=secret
        )
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: SlackApp) -> None:
        channels.slack_app_remove(tenant=obj.tenant, actor=Actor.for_user(admin_user(request)))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[SlackApp]) -> None:
        for app in queryset.select_related("tenant"):
            channels.slack_app_remove(tenant=app.tenant, actor=Actor.for_user(admin_user(request)))


@admin.register(SlackUserLink)
class SlackUserLinkAdmin(_TenantChoiceMixin, TenantScopedAdmin):
    """Links are listed and removed here, never made: only the person themself links their Slack
    account (a one-time code from the dashboard, sent from Slack)."""

    list_display = ["team_id", "slack_user_id", "user", "tenant", "created_at", "confirmed_at"]
    list_filter = [tenant_filter("tenant")]
    list_select_related = ["tenant", "user"]
    raw_id_fields = ["user"]
    # A tenant admin sees who is linked, not as which Slack user: superusers see all.
    _SLACK_IDS = ("team_id", "slack_user_id")

    def get_list_display(self, request: HttpRequest) -> Any:
        shown = list(super().get_list_display(request))
        return shown if request.user.is_superuser else [f for f in shown if f not in self._SLACK_IDS]

    def get_exclude(self, request: HttpRequest, obj: SlackUserLink | None = None) -> Any:
        return None if request.user.is_superuser else list(self._SLACK_IDS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: SlackUserLink | None = None) -> bool:
        return False

    def delete_model(self, request: HttpRequest, obj: SlackUserLink) -> None:
        channels.slack_user_link_remove(link=obj, actor=Actor.for_user(admin_user(request)))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[SlackUserLink]) -> None:
        for link in queryset.select_related("tenant", "user"):
            channels.slack_user_link_remove(link=link, actor=Actor.for_user(admin_user(request)))


@admin.register(SlackLinkCode)
class SlackLinkCodeAdmin(ReadOnlyAdmin):
    """Outstanding one-time link codes, to see who is linking: who asked and until when. Only the
    person themself makes one (the dashboard) and redeems it (Slack); the hash is not shown."""

    list_display = ["user", "tenant", "created_at", "expires_at"]
    list_filter = [tenant_filter("tenant")]
    list_select_related = ["tenant", "user"]
    exclude = ["code_hash"]


# --- The audit stream: a tenant's own sinks, the tenant admins' to manage ----------------------


class AuditSinkAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """The URL is hostile (``recovery.audit_stream.config.check_tenant_sink``: the outbound guard);
    the HEC token is write-only."""

    new_token = forms.CharField(
        label="New HEC token",
        required=False,
        max_length=audit_stream.TOKEN_MAX,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="HEC only; never shown again. Leave blank to keep the current one.",
    )

    class Meta:
        model = AuditSink
        fields = ["tenant", "kind", "url", "enabled"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        token = data.get("new_token") or self.instance.token
        if data.get("kind") and data.get("url"):
            try:
                audit_stream.check_tenant_sink(kind=data["kind"], url=data["url"], token=token)
            except errors.ValidationFailed as exc:
                field = exc.details.get("field") if exc.details.get("field") in ("url", "kind") else None
                self.add_error("new_token" if exc.details.get("field") == "token" else field, exc.message)
        return data


@admin.register(AuditSink)
class AuditSinkAdmin(_TenantChoiceMixin, TenantScopedAdmin):
    """Saved through ``recovery.audit_stream.config`` (checked again, audited)."""

    form = AuditSinkAdminForm
    list_display = ["tenant", "kind", "shown_url", "enabled"]

    def get_readonly_fields(self, request: HttpRequest, obj: AuditSink | None = None) -> tuple[str, ...]:
        # A sink is one per (tenant, kind): another tenant or kind is another sink, set anew.
        return ("tenant", "kind") if obj is not None else ()

    list_filter = ["kind", tenant_filter("tenant")]
    list_select_related = ["tenant"]

    def save_model(self, request: HttpRequest, obj: AuditSink, form: Any, change: bool) -> None:
        saved = audit_stream.sink_set(
            tenant=obj.tenant,
            actor=Actor.for_user(admin_user(request)),
            kind=obj.kind,
            url=obj.url,
            token=form.cleaned_data.get("new_token", ""),
            enabled=obj.enabled,
        )
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: AuditSink) -> None:
        audit_stream.sink_remove(tenant=obj.tenant, actor=Actor.for_user(admin_user(request)), kind=obj.kind)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[AuditSink]) -> None:
        for sink in queryset.select_related("tenant"):
            self.delete_model(request, sink)


@admin.register(AuditCursor)
class AuditCursorAdmin(ReadOnlyAdmin):
    """Where each sink is in each tenant's stream: moved only by the worker."""

    list_display = ["sink", "tenant", "position", "failures", "next_attempt_at"]
    list_filter = ["sink", tenant_filter("tenant")]
    list_select_related = ["tenant"]


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyAdmin):
    """Bulk decisions by filter (recovery.actions.bulk_filter): started, followed and aborted in
    the dashboard or the operator API, shown here."""

    list_display = ["id", "tenant", "action", "status", "total", "done", "failed", "skipped", "started_at"]
    list_filter = ["status", "action", tenant_filter("tenant")]
    search_fields = ["id"]


@admin.register(BulkItem)
class BulkItemAdmin(BigTableAdmin):
    tenant_field = "bulk__tenant"
    list_display = ["bulk", "position", "item", "outcome", "code", "decided_at"]
    list_filter = ["outcome"]
    search_fields = ["bulk__id", "run_id"]
