"""``POST /integrations/slack/interactions``: Approve / Reject pressed on an approval's Slack message.

Hostile until proven otherwise. The button's value names the tenant and the approval; it is read
only to find whose signing secret to check the request with, and trusted only once that check
passed (``X-Slack-Signature`` v0 over ``v0:{timestamp}:{raw body}``, the timestamp within five
minutes). Then the Slack user (team id + user id) must be mapped to an active dashboard user of
that tenant who holds the approver role, and the approval must be that tenant's; the decision is
``recovery.services.approval_approve`` / ``approval_reject`` — the dashboard's own, so the same
rules hold (four eyes: whoever asked cannot grant; an expired or decided approval is refused).

Answers: 400 for a request that is not a button press of ours, 401 when the signature does not
check out (also for an unknown tenant or one without a Slack app: the same answer, so nothing
about tenants leaks), otherwise 200 — the outcome goes back through the payload's
``response_url``: the message replaced with the decision and who made it, or a refusal only the
presser sees. A replayed press finds the approval decided and is refused; nothing changes twice.
"""

from __future__ import annotations

import structlog
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from dashboard.permissions import Capability, can
from dashboard.selectors import grants_line
from ledger.audit import Actor
from ledger.errors import SagaError
from ledger.ids import looks_like_id
from ledger.models import Tenant
from recovery import channels, notifications, services, slack
from recovery.decisions import refusal_sentence
from recovery.models import Approval, SlackApp

log = structlog.get_logger("saga_admin.slack")


def _refuse(interaction: slack.Interaction, text: str, *, why: str) -> HttpResponse:
    log.info(
        "slack.interaction_refused",
        tenant=interaction.tenant_slug,
        why=why,
        approval_id=interaction.approval_id,
    )
    notifications.enqueue_slack_respond(
        response_url=interaction.response_url, message=slack.refusal_message(text)
    )
    return HttpResponse(status=200)


@csrf_exempt  # Slack cannot send a CSRF token; the request signature stands in for it.
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    raw = request.body
    interaction = slack.parse_interaction(request.POST.get("payload", ""))
    if interaction is None:
        return HttpResponse("Not an Approve / Reject interaction.", status=400, content_type="text/plain")
    app = (
        SlackApp.objects.select_related("tenant").filter(tenant__slug=interaction.tenant_slug).first()
        if len(interaction.tenant_slug) <= 50
        else None
    )
    verified = app is not None and slack.signature_ok(
        signing_secret=app.signing_secret,
        body=raw,
        timestamp=request.headers.get("X-Slack-Request-Timestamp", ""),
        signature=request.headers.get("X-Slack-Signature", ""),
    )
    if app is None or not verified:
        log.warning("slack.signature_refused", tenant=interaction.tenant_slug[:50])
        return HttpResponse("Signature verification failed.", status=401, content_type="text/plain")
    tenant: Tenant = app.tenant
    approval = (
        Approval.objects.select_related("run", "tenant")
        .filter(pk=interaction.approval_id, tenant=tenant)
        .first()
        if looks_like_id(interaction.approval_id)
        else None
    )
    if approval is None:
        return _refuse(
            interaction, "Saga Admin has no such approval for this workspace.", why="unknown_approval"
        )
    user = channels.slack_user_for(
        tenant=tenant, team_id=interaction.team_id, slack_user_id=interaction.user_id
    )
    if user is None:
        return _refuse(
            interaction,
            f"Your Slack user is not linked to a Saga Admin user of {tenant.name}, so Saga Admin cannot "
            "tell who you are: nothing was decided. A tenant admin can link you under Notification settings.",
            why="unmapped",
        )
    if not can(user, Capability.APPROVE, tenant.pk):
        return _refuse(
            interaction,
            f"{user.get_username()} does not hold the approver role in {tenant.name}: nothing was decided.",
            why="not_approver",
        )
    actor = Actor.for_user(user)
    verb = "Approved" if interaction.approve else "Rejected"
    reason = f"{verb} in Slack by {user.get_username()} (Slack user {interaction.user_name})"
    try:
        if interaction.approve:
            decided = services.approval_approve(approval=approval, actor=actor, reason=reason)
        else:
            decided = services.approval_reject(approval=approval, actor=actor, reason=reason)
    except SagaError as exc:
        return _refuse(interaction, f"Not decided: {refusal_sentence(exc)}", why=exc.code)
    summary = f"{decided.tool} ({decided.risk} risk) on run {decided.run_id}"
    if interaction.approve and decided.status == Approval.Status.PENDING:
        # One grant of several (``approvers``): the message keeps its buttons for the others.
        notifications.enqueue_slack_respond(
            response_url=interaction.response_url,
            message={
                "replace_original": True,
                **slack.message(
                    summary=summary,
                    url=notifications.public_url(f"/runs/{decided.run_id}/"),
                    risk=decided.risk,
                    run_id=decided.run_id,
                    lines=[f"{grants_line(decided)} so far: nobody counts twice."],
                    tenant_slug=tenant.slug,
                    approval_id=decided.pk,
                ),
            },
        )
        return HttpResponse(status=200)
    notifications.enqueue_slack_respond(
        response_url=interaction.response_url,
        message=slack.decided_message(
            summary=summary,
            url=notifications.public_url(f"/runs/{decided.run_id}/"),
            outcome=verb,
            who=user.get_username(),
            reason=reason,
        ),
    )
    return HttpResponse(status=200)
