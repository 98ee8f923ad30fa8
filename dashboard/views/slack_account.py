"""Your Slack account: where a signed-in user links their own Slack account to their dashboard
user, tenant by tenant, and removes a link. The only way a link is made: the page shows the user a
one-time code (``recovery.actions.channels.slack_link_code_issue``, for ``request.user`` and nobody else),
which they send from Slack with ``/saga link TENANT CODE`` — a request Slack signs for the Slack
user who typed it (``dashboard.views.slack.commands``). An admin can remove links, never make one."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from dashboard.permissions import Capability, reach_for, require_tenant, tenant_ids_with
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from ledger.models import Tenant
from recovery.actions import channels
from recovery.decisions import refusal_sentence
from recovery.models import SlackApp, SlackUserLink


def _tenants_with_slack(request: HtmxHttpRequest) -> list[Tenant]:
    # Only approvers decide from Slack, so only they link an account (a press by anyone else is
    # refused anyway).
    tenant_ids = tenant_ids_with(request.user, Capability.APPROVE)
    connected = SlackApp.objects.filter(tenant_id__in=tenant_ids).values_list("tenant_id", flat=True)
    return list(Tenant.objects.filter(pk__in=connected).order_by("slug"))


def _page(
    request: HtmxHttpRequest, *, issued: dict[str, Any] | None = None, status: int = 200
) -> HttpResponse:
    assert request.user.is_authenticated  # behind login_required
    tenants = _tenants_with_slack(request)
    links = SlackUserLink.objects.filter(user=request.user, tenant__in=tenants).select_related("tenant")
    return render(
        request,
        "dashboard/slack_account.html",
        {"tenants": tenants, "links": list(links), "issued": issued},
        status=status,
    )


@require_GET
@login_required
def slack_account(request: HtmxHttpRequest) -> HttpResponse:
    return _page(request)


@require_POST
@login_required
def slack_link_code(request: HtmxHttpRequest, slug: str) -> HttpResponse:
    tenant = require_tenant(request.user, Capability.APPROVE, slug=slug)
    assert request.user.is_authenticated
    try:
        issued = channels.slack_link_code_issue(tenant=tenant, user=request.user)
    except SagaError as exc:
        messages.error(request, refusal_sentence(exc))
        return common.done(request, reverse("dashboard:slack-account"))
    # Shown once, on this page: not in a redirect's message (a cookie or the session).
    return _page(
        request,
        issued={
            "tenant": tenant,
            "command": f"/saga link {tenant.slug} {issued.code}",
            "expires_at": issued.expires_at,
        },
    )


@require_POST
@login_required
def slack_link_remove(request: HtmxHttpRequest, link_id: int) -> HttpResponse:
    """Remove a link: the linked user themself, or an admin of its tenant."""
    link = reach_for(request.user).first(SlackUserLink.objects.select_related("tenant", "user"), link_id)
    if link is None:
        raise Http404("No such Slack link.")
    administers = link.tenant_id in tenant_ids_with(request.user, Capability.ADMINISTER)
    if link.user_id != request.user.pk and not administers:
        raise PermissionDenied("Only the linked user or a tenant admin can remove a Slack link.")
    channels.slack_user_link_remove(link=link, actor=common.actor(request))
    messages.success(request, f"Removed the link of Slack user {link.team_id}/{link.slack_user_id}.")
    if request.POST.get("next") == "settings" and administers:
        return common.done(request, f"{reverse('dashboard:notification-settings')}?tenant={link.tenant.slug}")
    return common.done(request, reverse("dashboard:slack-account"))
