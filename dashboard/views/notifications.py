"""Notifications in the dashboard: the outbox (each channel's last delivery, last failure and
backlog; every notification and its attempts: status, attempts, last error, next attempt) for
operators and admins, and a tenant's notification
settings for its admins — channels (add, edit, delete, send a test), the Slack app (its signing
secret: write-only, never shown again) and which Slack users are which dashboard users (listed;
removed in ``dashboard.views.slack_account``, never made by an admin). The services are
``recovery.actions.channels``; these views parse, check the role and call them."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.forms import ChannelForm, SlackAppForm
from dashboard.permissions import Capability, reach_for, require, require_tenant, tenant_ids_with
from dashboard.selectors.outbox import channel_statuses
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from infra.ids import looks_like_id
from ledger.models import Membership, Tenant
from recovery.actions import channels
from recovery.decisions import refusal_sentence
from recovery.models import Notification, NotificationChannel, NotificationEvent, SlackApp, SlackUserLink

OUTBOX_SHOWN = 200


@require_GET
@login_required
def outbox(request: HtmxHttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_with(request.user, Capability.OPERATE)
    if not tenant_ids:
        raise PermissionDenied("Notifications are shown to operators and admins.")
    status = request.GET.get("status", "")
    status = status if status in Notification.Status.values else ""
    rows = channels.notifications_of(tenant_ids=tenant_ids, status=status, limit=OUTBOX_SHOWN)
    administered = tenant_ids_with(request.user, Capability.ADMINISTER)
    return render(
        request,
        "dashboard/notifications.html",
        {
            "rows": rows,
            # Each channel's last delivery, last failure and backlog, above the rows themselves.
            "channel_statuses": channel_statuses(tenant_ids=tenant_ids),
            "administered": set(administered),
            "status": status,
            "statuses": Notification.Status.choices,
            "several_tenants": len(tenant_ids) > 1,
            "can_configure": bool(administered),
            "shown_max": OUTBOX_SHOWN,
        },
    )


# --- Settings (tenant admins) ------------------------------------------------------------------


def _administered(request: HtmxHttpRequest) -> list[Tenant]:
    return list(
        Tenant.objects.filter(pk__in=tenant_ids_with(request.user, Capability.ADMINISTER)).order_by("slug")
    )


def _settings_url(tenant: Tenant) -> str:
    return f"{reverse('dashboard:notification-settings')}?tenant={tenant.slug}"


def _settings_page(
    request: HtmxHttpRequest,
    tenant: Tenant,
    *,
    channel_form: ChannelForm | None = None,
    slack_form: SlackAppForm | None = None,
    new_secret: dict[str, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    roles = dict(Membership.objects.filter(tenant=tenant).values_list("user_id", "role"))
    links = list(SlackUserLink.objects.filter(tenant=tenant).select_related("user"))
    context = {
        "tenant": tenant,
        "tenants": _administered(request),
        "channels": list(channels.channels_of(tenant_ids=[tenant.pk])),
        "channel_form": channel_form or ChannelForm(initial={"enabled": True, "min_risk": "low"}),
        "slack_app": SlackApp.objects.filter(tenant=tenant).first(),
        "slack_form": slack_form or SlackAppForm(),
        "links": [{"link": link, "role": roles.get(link.user_id, "")} for link in links],
        "new_secret": new_secret,
        "events": NotificationEvent,
        "interactions_url": request.build_absolute_uri(reverse("slack-interactions")),
        "commands_url": request.build_absolute_uri(reverse("slack-commands")),
    }
    return render(request, "dashboard/notification_settings.html", context, status=status)


@require_GET
@login_required
def settings_page(request: HtmxHttpRequest) -> HttpResponse:
    tenants = _administered(request)
    if not tenants:
        raise PermissionDenied("Notification settings are for tenant admins.")
    wanted = request.GET.get("tenant", "")
    tenant = next((t for t in tenants if t.slug == wanted), tenants[0])
    return _settings_page(request, tenant)


def _form_refused(form: Any, exc: SagaError) -> None:
    fields = exc.details.get("fields") if isinstance(exc.details, dict) else None
    if isinstance(fields, dict):
        for name, problems in fields.items():
            form.add_error(name if name in form.fields else None, " ".join(map(str, problems)))
    elif isinstance(exc.details, dict) and exc.details.get("field") in form.fields:
        form.add_error(exc.details["field"], exc.message)
    elif isinstance(exc.details, dict) and "name" in exc.details:
        form.add_error("name", exc.message)
    else:
        form.add_error(None, refusal_sentence(exc))


@require_POST
@login_required
def channel_create(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = require_tenant(request.user, Capability.ADMINISTER, slug=slug)
    form = ChannelForm(request.POST)
    if form.is_valid():
        try:
            saved = channels.channel_create(tenant=tenant, actor=common.actor(request), **form.settings())
        except SagaError as exc:
            _form_refused(form, exc)
        else:
            messages.success(request, f"Added channel {saved.channel.name}.")
            if saved.generated_secret:
                # Shown once, on this page: not in a redirect's message (a cookie or the session).
                return _settings_page(
                    request,
                    tenant,
                    new_secret={"channel": saved.channel.name, "secret": saved.generated_secret},
                )
            return common.done(request, _settings_url(tenant))
    return _settings_page(request, tenant, channel_form=form, status=422)


def _get_channel_for_admin(request: HtmxHttpRequest, channel_id: str) -> NotificationChannel:
    channel = None
    if looks_like_id(channel_id):
        channel = reach_for(request.user).first(
            NotificationChannel.objects.select_related("tenant"), channel_id
        )
    if channel is None:
        raise Http404("No such channel.")
    require(request.user, Capability.ADMINISTER, channel.tenant_id)
    return channel


@require_http_methods(["GET", "POST"])
@login_required
def channel_edit(request: HtmxHttpRequest, channel_id: str) -> HttpResponse:
    channel = _get_channel_for_admin(request, channel_id)
    initial = {
        "name": channel.name,
        "kind": channel.kind,
        "target": channel.target,
        "events": channel.events,
        "min_risk": channel.min_risk,
        "enabled": channel.enabled,
    }
    form = ChannelForm(request.POST or None, initial=initial)
    new_secret = None
    if request.method == "POST" and form.is_valid():
        settings = form.settings()
        if request.POST.get("regenerate") == "yes":
            settings["secret"] = "generate"
        try:
            saved = channels.channel_update(channel=channel, actor=common.actor(request), **settings)
        except SagaError as exc:
            _form_refused(form, exc)
        else:
            messages.success(request, f"Saved channel {saved.channel.name}.")
            if not saved.generated_secret:
                return common.done(request, _settings_url(channel.tenant))
            channel = saved.channel
            new_secret = {"channel": channel.name, "secret": saved.generated_secret}
    status = 422 if form.errors else 200
    return render(
        request,
        "dashboard/notification_channel_edit.html",
        {"channel": channel, "form": form, "new_secret": new_secret},
        status=status,
    )


@require_POST
@login_required
def channel_delete(request: HtmxHttpRequest, channel_id: str) -> HttpResponse:
    channel = _get_channel_for_admin(request, channel_id)
    tenant = channel.tenant
    channels.channel_delete(channel=channel, actor=common.actor(request))
    messages.success(request, f"Deleted channel {channel.name}. Its past notifications stay listed.")
    return common.done(request, _settings_url(tenant))


@require_POST
@login_required
def channel_test(request: HtmxHttpRequest, channel_id: str) -> HttpResponse:
    channel = _get_channel_for_admin(request, channel_id)
    row = channels.channel_send_test(channel=channel, actor=common.actor(request))
    messages.success(
        request,
        f"Test notification {row.pk} queued for {channel.name}. Its delivery shows on the Notifications page.",
    )
    return common.done(request, f"{reverse('dashboard:notifications')}#notification-{row.pk}")


@require_POST
@login_required
def slack_app(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = require_tenant(request.user, Capability.ADMINISTER, slug=slug)
    if request.POST.get("remove") == "yes":
        if channels.slack_app_remove(tenant=tenant, actor=common.actor(request)):
            messages.success(
                request, "Disconnected the Slack app: approval messages no longer carry buttons."
            )
        return common.done(request, _settings_url(tenant))
    form = SlackAppForm(request.POST)
    if form.is_valid():
        try:
            channels.slack_app_set(
                tenant=tenant, actor=common.actor(request), signing_secret=form.cleaned_data["signing_secret"]
            )
        except SagaError as exc:
            _form_refused(form, exc)
        else:
            messages.success(
                request,
                "Slack app connected: approval messages to Slack channels carry buttons. A press "
                "counts once the person confirms it in Saga Admin; every earlier Slack link was "
                "removed, so each person links their account again.",
            )
            return common.done(request, _settings_url(tenant))
    return _settings_page(request, tenant, slack_form=form, status=422)
