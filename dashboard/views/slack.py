"""Slack's signed requests: ``POST /integrations/slack/interactions`` (Approve / Reject pressed on
an approval's message) and ``POST /integrations/slack/commands`` (``/saga link TENANT CODE``, by
which a person links their own Slack account).

Hostile until proven otherwise. Before anything is parsed the body must fit the size limit; the
payload must be one JSON object nested no deeper than a Slack payload (anything else, huge or not
JSON or of the wrong types, is a 400). The tenant named in it (the button's value, the command's
text) is read only to find whose signing secret to check the request with, and trusted only once
that check passed (``X-Slack-Signature`` v0 over ``v0:{timestamp}:{raw body}``, the timestamp
within five minutes). Refusals (400, 401) count against the client's address
(``SAGA_UNAUTHENTICATED_RATE``; over it, 429 with ``Retry-After``); verified requests count
against their Slack workspace (``SAGA_SLACK_RATE``), so nobody can use up a workspace's budget
without its app's secret, and Slack's own addresses are never blocked by someone else's forgeries.

A press: the Slack user (team id + user id) must be linked — by themself — to an active dashboard
user of that tenant who holds the approver role, and the approval must be that tenant's; Approve
carries the hash of the arguments its message showed and approves only while the approval's
arguments still hash to it. The decision is ``recovery.actions.approvals.approval_decide_press``
(``approval_approve`` / ``approval_reject``) — the dashboard's own, so the same rules hold (four
eyes: whoever asked cannot grant; an expired or decided approval is refused) — on the
installation's Slack app, whose secret only the operator holds. On an app whose secret a tenant
admin set (and could sign with as anyone), a press decides nothing: its answer links to
``dashboard.views.slack_confirm``, where the linked person confirms it signed in as themself
(``recovery.actions.channels.slack_press_decides``).
Answers: 200 with the outcome posted back through the payload's ``response_url`` — the message
replaced with the decision and who made it, or a refusal (or the request to confirm) only the
presser sees. A replayed press finds the approval decided and is refused.
"""

from __future__ import annotations

import math

import structlog
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from dashboard.permissions import Capability, can
from dashboard.presenters.approval_cards import grants_line
from infra.conf import saga
from infra.error_bodies import error_body
from infra.errors import SagaError
from infra.ids import looks_like_id
from infra.throttle import client_address, fixed_window
from ledger.audit import Actor
from ledger.models import Tenant
from recovery import slack
from recovery.actions import approvals, channels
from recovery.decisions import refusal_sentence
from recovery.models import Approval, SlackApp
from recovery.notifications import delivery, outbox

log = structlog.get_logger(__name__)


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status)


def _too_many(code: str, message: str, retry_after: float) -> JsonResponse:
    response = _error(429, code, message)
    response["Retry-After"] = str(max(1, math.ceil(retry_after)))
    # Logged once when the limit is crossed, not once per request by Django.
    setattr(response, "_has_been_logged", True)  # noqa: B010 - Django's own flag
    return response


def _refused(request: HttpRequest, status: int, code: str, message: str) -> JsonResponse:
    """A refusal (400, 401), or 429 once this address has had more of them than the
    unauthenticated rate allows in the current window."""
    address = client_address(request)
    window = fixed_window(f"slack-refused:{address}", saga().unauthenticated_rate)
    if window is None or window.allowed:
        return _error(status, code, message)
    if window.count == window.limit + 1:
        log.warning("slack.refusals_throttled", address=address, limit=saga().unauthenticated_rate)
    return _too_many(
        "rate_limited", "Too many refused Slack requests from this address; retry later.", window.retry_after
    )


def _team_throttled(team_id: str) -> JsonResponse | None:
    """429 once a Slack workspace has sent more verified requests than ``SAGA_SLACK_RATE``."""
    window = fixed_window(f"slack-team:{team_id}", saga().slack_rate)
    if window is None or window.allowed:
        return None
    if window.count == window.limit + 1:
        log.warning("slack.team_throttled", team_id=team_id, limit=saga().slack_rate)
    return _too_many(
        "rate_limited", "Too many requests from this Slack workspace; retry later.", window.retry_after
    )


def _form(request: HttpRequest) -> tuple[bytes, QueryDict] | None:
    """The raw body (what the signature covers) and its form fields, or None for a body over the
    size limit (refused before it is read, when its length is announced), another content type
    than Slack's form encoding, or one Django will not parse (too many fields)."""
    limit = min(saga().max_body_bytes, settings.DATA_UPLOAD_MAX_MEMORY_SIZE or saga().max_body_bytes)
    try:
        announced = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    if announced > limit:
        return None
    if request.content_type != "application/x-www-form-urlencoded":
        return None  # all Slack sends; a multipart body is not read at all
    try:
        raw = request.body
        form = request.POST
    except (RequestDataTooBig, TooManyFieldsSent):
        return None
    return (raw, form) if len(raw) <= limit else None


def _verified_app(request: HttpRequest, raw: bytes, tenant_slug: str) -> SlackApp | None:
    """The Slack app of ``tenant_slug`` if the request is signed with its secret, else None (an
    unknown tenant or one without an app gets the same answer as a bad signature)."""
    app = (
        SlackApp.objects.select_related("tenant").filter(tenant__slug=tenant_slug).first()
        if len(tenant_slug) <= 50
        else None
    )
    verified = app is not None and slack.signature_ok(
        signing_secret=channels.slack_app_secret(app),
        body=raw,
        timestamp=request.headers.get("X-Slack-Request-Timestamp", ""),
        signature=request.headers.get("X-Slack-Signature", ""),
    )
    if app is None or not verified:
        log.warning("slack.signature_refused", tenant=tenant_slug[:50])
        return None
    return app


def _refuse(interaction: slack.Interaction, text: str, *, why: str) -> HttpResponse:
    log.info(
        "slack.interaction_refused",
        tenant=interaction.tenant_slug,
        why=why,
        approval_id=interaction.approval_id,
    )
    delivery.enqueue_slack_respond(response_url=interaction.response_url, message=slack.refusal_message(text))
    return HttpResponse(status=200)


@csrf_exempt  # Slack cannot send a CSRF token; the request signature stands in for it.
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    received = _form(request)
    if received is None:
        return _refused(request, 400, "invalid_request", "The request is too large or not a form.")
    raw, form = received
    interaction = slack.parse_interaction(form.get("payload", ""))
    if interaction is None:
        return _refused(request, 400, "invalid_request", "Not an Approve / Reject interaction.")
    app = _verified_app(request, raw, interaction.tenant_slug)
    if app is None:
        return _refused(request, 401, "unauthorized", "Signature verification failed.")
    if (throttled := _team_throttled(interaction.team_id)) is not None:
        return throttled
    return _press(interaction, app)


def _press(interaction: slack.Interaction, app: SlackApp) -> HttpResponse:
    """A verified press: refused (said to the presser only) unless the approval is the tenant's,
    the Slack user is linked to a user who approves there, and an Approve press is bound to the
    arguments its message showed in full; otherwise decided — or, when a tenant admin set the
    app's secret (and so could have signed it), only asked: the linked person confirms it in the
    dashboard."""
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
            "tell who you are: nothing was decided. Link it yourself: in Saga Admin, open “Your Slack "
            "account” and send the command it shows.",
            why="unmapped",
        )
    if not can(user, Capability.APPROVE, tenant.pk):
        return _refuse(
            interaction,
            f"{user.get_username()} does not hold the approver role in {tenant.name}: nothing was decided.",
            why="not_approver",
        )
    if interaction.approve and not interaction.args_hash:
        # A message from before Approve was bound to the arguments it shows.
        return _refuse(
            interaction,
            "This message's Approve button is not bound to the arguments it shows: nothing was "
            "decided. Approve it in the Saga Admin inbox.",
            why="unbound_approve",
        )
    if interaction.approve and not slack.lines_fit(outbox.approval_lines(approval)):
        # Its message had no Approve button (the arguments could not be shown whole): a press that
        # says otherwise was not made on it.
        return _refuse(
            interaction,
            "These arguments are too long to show in Slack, so they can be approved only in the "
            "Saga Admin inbox: nothing was decided.",
            why="args_cut",
        )
    if not channels.slack_press_decides(app):
        return _ask_to_confirm(interaction, approval, user)
    return _decide(interaction, tenant, approval, user)


def _ask_to_confirm(interaction: slack.Interaction, approval: Approval, user: User) -> HttpResponse:
    """A press signed with a secret a tenant admin set: anyone who knows the secret could have
    signed it as this Slack user, so it decides nothing. The answer (to the presser only) says so
    and links to the page where the linked person confirms it, signed in as themself."""
    token = slack.press_token(
        slack.PressRequest(
            approval_id=approval.pk,
            user_id=user.pk,
            approve=interaction.approve,
            args_hash=interaction.args_hash,
            slack_user=f"{interaction.team_id}/{interaction.user_id}",
        )
    )
    url = outbox.public_url(reverse("dashboard:slack-press-confirm", args=[token]))
    verb = "approval" if interaction.approve else "rejection"
    log.info("slack.press_to_confirm", tenant=approval.tenant.slug, approval_id=approval.pk, user=user.pk)
    delivery.enqueue_slack_respond(
        response_url=interaction.response_url,
        message=slack.refusal_message(
            f"Not decided yet: {approval.tenant.name}'s Slack app is signed with a secret its admins "
            f"set, so a press in Slack counts only once you confirm it. Confirm your {verb} in Saga "
            f"Admin, signed in as {user.get_username()}, within "
            f"{slack.PRESS_CONFIRM_MAX_AGE_S // 60} minutes: <{url}|confirm it>."
        ),
    )
    return HttpResponse(status=200)


def _decide(interaction: slack.Interaction, tenant: Tenant, approval: Approval, user: User) -> HttpResponse:
    """The decision, through the dashboard's own services, and its outcome posted back through
    the press's ``response_url``."""
    actor = Actor.for_user(user)
    verb = "Approved" if interaction.approve else "Rejected"
    reason = f"{verb} in Slack by {user.get_username()} (Slack user {interaction.user_name})"
    try:
        decided = approvals.approval_decide_press(
            approval=approval,
            actor=actor,
            approve=interaction.approve,
            shown_args_hash=interaction.args_hash,
            reason=reason,
        )
    except SagaError as exc:
        return _refuse(interaction, f"Not decided: {refusal_sentence(exc)}", why=exc.code)
    summary = f"{decided.tool} ({decided.risk} risk) on run {decided.run_id}"
    if interaction.approve and decided.status == Approval.Status.PENDING:
        # One grant of several (``approvers``): the message keeps its buttons for the others.
        delivery.enqueue_slack_respond(
            response_url=interaction.response_url,
            message={
                "replace_original": True,
                **slack.message(
                    summary=summary,
                    url=outbox.public_url(f"/runs/{decided.run_id}/"),
                    risk=decided.risk,
                    run_id=decided.run_id,
                    # The arguments again: the buttons left for the others approve what they show.
                    lines=[
                        f"{grants_line(decided)} so far: nobody counts twice.",
                        *outbox.approval_lines(decided),
                    ],
                    tenant_slug=tenant.slug,
                    approval_id=decided.pk,
                    args_hash=decided.args_hash,
                ),
            },
        )
        return HttpResponse(status=200)
    delivery.enqueue_slack_respond(
        response_url=interaction.response_url,
        message=slack.decided_message(
            summary=summary,
            url=outbox.public_url(f"/runs/{decided.run_id}/"),
            outcome=verb,
            who=user.get_username(),
            reason=reason,
        ),
    )
    return HttpResponse(status=200)


@csrf_exempt  # Slack cannot send a CSRF token; the request signature stands in for it.
@require_POST
def commands(request: HttpRequest) -> HttpResponse:
    """``/saga link TENANT CODE``: the Slack user who typed it becomes the dashboard user the code
    was shown to (``recovery.actions.channels.slack_link_redeem``). The answer is the command's reply,
    shown only to them."""
    received = _form(request)
    if received is None:
        return _refused(request, 400, "invalid_request", "The request is too large or not a form.")
    raw, form = received
    if form.get("ssl_check") == "1":
        return HttpResponse(status=200)  # Slack checking the certificate: nothing to do
    command = slack.parse_link_command(form)
    if command is None:
        return _refused(request, 400, "invalid_request", slack.LINK_USAGE)
    app = _verified_app(request, raw, command.tenant_slug)
    if app is None:
        return _refused(request, 401, "unauthorized", "Signature verification failed.")
    if (throttled := _team_throttled(command.team_id)) is not None:
        return throttled
    tenant: Tenant = app.tenant
    try:
        link = channels.slack_link_redeem(
            tenant=tenant, team_id=command.team_id, slack_user_id=command.user_id, code=command.code
        )
    except SagaError as exc:
        log.info("slack.link_refused", tenant=tenant.slug, why=exc.code, team_id=command.team_id)
        return JsonResponse(slack.command_reply(f"Not linked: {exc.message}"))
    log.info("slack.linked", tenant=tenant.slug, team_id=command.team_id, user=link.user.get_username())
    return JsonResponse(
        slack.command_reply(
            f"Linked: in {tenant.name}, your Slack account now acts as {link.user.get_username()} — "
            "Approve and Reject buttons decide as that user, under that user's role."
        )
    )
