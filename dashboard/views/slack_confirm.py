"""Confirming a Slack press: where a press made on a Slack app whose signing secret a tenant admin
set (so that admin could have signed it as anyone linked) becomes a decision — only when the linked
person, signed in as themself, confirms it here. The press's answer in Slack links to this page
(``dashboard.views.slack``); the link is signed, short-lived and bound to the approval, the person,
the choice and the arguments' hash (``recovery.slack.press_from_token``), and holding it without
that person's session decides nothing.

``GET`` shows the approval as it is now and what the press asked; ``POST`` (CSRF-protected, the
same URL) decides through the dashboard's own services, so every rule of a decision holds (four
eyes, one grant per person, bound to the arguments shown)."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from dashboard.permissions import Capability, tenant_ids_with
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from recovery import slack
from recovery.actions import approvals
from recovery.decisions import refusal_sentence
from recovery.models import Approval

TEMPLATE = "dashboard/slack_press_confirm.html"


def _refusal(request: HtmxHttpRequest, sentence: str, status: int) -> HttpResponse:
    return render(request, TEMPLATE, {"refusal": sentence}, status=status)


@require_http_methods(["GET", "POST"])
@login_required
def slack_press_confirm(request: HtmxHttpRequest, token: str) -> HttpResponse:
    assert request.user.is_authenticated
    press = slack.press_from_token(token)
    if press is None:
        return _refusal(
            request,
            "This confirmation link is unknown or older than "
            f"{slack.PRESS_CONFIRM_MAX_AGE_S // 60} minutes: nothing was decided. Decide in the "
            "approval inbox, or press again in Slack.",
            410,
        )
    # Another tenant's approval is not found (never reveal it exists); one of this person's
    # tenants pressed as someone else, or by someone who does not approve there, is refused.
    approval = (
        Approval.objects.select_related("run", "tenant")
        .filter(pk=press.approval_id, tenant_id__in=tenant_ids_with(request.user, Capability.VIEW))
        .first()
    )
    if approval is None:
        return _refusal(request, "No such approval among those you see.", 404)
    if press.user_id != request.user.pk:
        return _refusal(
            request,
            "This press was made as another person's Slack account: only that person confirms it, "
            "signed in as themself. Nothing was decided.",
            403,
        )
    if approval.tenant_id not in tenant_ids_with(request.user, Capability.APPROVE):
        return _refusal(request, f"You do not hold the approver role in {approval.tenant.name}.", 403)
    changed = press.approve and approval.args_hash != press.args_hash
    if request.method == "POST":
        return _confirm(request, approval, press)
    return render(
        request,
        TEMPLATE,
        {
            "approval": approval,
            "press": press,
            "changed": changed,
            "args": json.dumps(approval.args, indent=2, sort_keys=True, ensure_ascii=False),
        },
    )


def _confirm(request: HtmxHttpRequest, approval: Approval, press: slack.PressRequest) -> HttpResponse:
    actor = common.actor(request)
    verb = "Approved" if press.approve else "Rejected"
    reason = (
        f"{verb} in Slack by {request.user.get_username()} (Slack user {press.slack_user}), "
        "confirmed in the dashboard"
    )
    try:
        decided = approvals.approval_decide_press(
            approval=approval,
            actor=actor,
            approve=press.approve,
            shown_args_hash=press.args_hash,
            reason=reason,
        )
    except SagaError as exc:
        return _refusal(request, f"Not decided: {refusal_sentence(exc)}", exc.status)
    messages.success(
        request,
        f"Approval {decided.pk}: your grant is recorded; it needs more people."
        if decided.status == Approval.Status.PENDING
        else f"Approval {decided.pk} {decided.status}.",
    )
    return common.done(request, reverse("dashboard:approvals"))
