"""Delivering one outbox row: a worker job (``notification_deliver``) claims the row by
compare-and-set, sends it (e-mail, signed webhook, Slack, Teams card, PagerDuty event) and records
the attempt; a failure that may pass is retried with exponential backoff, and the sweeper
re-enqueues rows whose job was lost (Redis down when it was enqueued, a worker killed). So Redis or
a channel being down delays a notification and loses nothing. Also the answer to a Slack interaction (``slack_respond``).

URLs a tenant chose go through ``infra.outbound`` (checked, pinned, no redirects); the operator's
own SAGA_NOTIFY_WEBHOOKS do not.
"""

from __future__ import annotations

import json
import re
import smtplib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import structlog
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from infra import deadline, errors, outbound
from infra.conf import saga
from infra.signing import signed_headers
from ledger.transitions import compare_and_set_rows, try_compare_and_set
from recovery import queueing, slack, teams
from recovery.models import AgentCommand, Approval, Notification, SlackApp
from recovery.notifications import email_links, outbox, pagerduty
from recovery.notifications.outbox import Event, Kind, enqueue_delivery

log = structlog.get_logger(__name__)


# How many attempts a row remembers (the dashboard's Notifications page shows them).
HISTORY_KEPT = 10

_Status = Notification.Status
# An outbox row is claimed (sending) by one worker at a time, and claimed again when that worker's
# lease expires; the attempt's outcome ends it (delivered, dropped, failed) or puts it back to wait
# for its next attempt (pending). A sweep fails a sending row out of attempts whose worker was lost.
NOTIFICATION_TRANSITIONS: dict[str, set[str]] = {
    _Status.PENDING: {_Status.SENDING},
    _Status.SENDING: {_Status.SENDING, _Status.DELIVERED, _Status.DROPPED, _Status.PENDING, _Status.FAILED},
    _Status.DELIVERED: set(),
    _Status.DROPPED: set(),
    _Status.FAILED: set(),
}


@dataclass(frozen=True)
class Attempt:
    """One attempt's outcome: ``delivered``, ``retry`` (may pass: a timeout, a 5xx, a 429) or
    ``failed`` (will not pass by itself: a 4xx, a refused URL, a deleted channel)."""

    outcome: str
    error: str = ""
    status_code: int | None = None


def notification_backoff_s(attempt: int) -> float:
    config = saga()
    factor: int = 2 ** max(0, attempt - 1)
    return float(min(config.retry_backoff_max_s * 10, config.retry_backoff_base_s * factor))


def _lease_s() -> float:
    return saga().webhook_timeout_s * 2 + 30


def notification_claim(*, notification_id: str) -> Notification | None:
    """pending (due) → sending, or sending with an expired lease (its worker died) → sending again,
    by compare-and-set: of two workers holding jobs for one row, one sends and the other finds
    nothing. Counts the attempt and takes a new fencing token."""
    now = timezone.now()
    claimed = compare_and_set_rows(
        Notification.objects.filter(pk=notification_id, attempts__lt=F("max_attempts")),
        table=NOTIFICATION_TRANSITIONS,
        to=Notification.Status.SENDING,
        when={
            Notification.Status.PENDING: Q(next_attempt_at__lte=now),
            Notification.Status.SENDING: Q(lease_expires_at__lt=now),
        },
        updates={
            "attempts": F("attempts") + 1,
            "lease_token": F("lease_token") + 1,
            "lease_expires_at": now + timedelta(seconds=_lease_s()),
            "updated_at": now,
        },
    )
    if claimed != 1:
        return None
    return Notification.objects.select_related("tenant", "channel").get(pk=notification_id)


def notification_deliver(*, notification_id: str) -> str:
    """Claim the row, send it, record the attempt (a worker job; safe to run twice). Returns the
    outcome, or ``skipped`` when there was nothing to claim (delivered, not due, or another
    worker has it)."""
    row = notification_claim(notification_id=notification_id)
    if row is None:
        return "skipped"
    try:
        attempt = _send(row)
    except Exception as exc:  # a bug or an unforeseen library error: retried, never lost
        log.exception("notifications.send_crashed", notification_id=row.pk)
        attempt = Attempt("retry", f"{type(exc).__name__}: {exc}")
    return _record(row, attempt)


def _record(row: Notification, attempt: Attempt) -> str:
    """Store the attempt (fenced by the claim's token) and return what became of the row:
    ``delivered``, ``retry``, ``failed`` or ``dropped`` (``fenced`` when the claim was lost)."""
    now = timezone.now()
    history = [
        *row.history[-(HISTORY_KEPT - 1) :],
        {
            "attempt": row.attempts,
            "at": now.isoformat(),
            "outcome": attempt.outcome,
            "error": attempt.error[:500],
            "status_code": attempt.status_code,
        },
    ]
    updates: dict[str, Any] = {
        "lease_expires_at": None,
        "last_error": attempt.error[:2000],
        "last_status_code": attempt.status_code,
        "history": history,
        "updated_at": now,
    }
    delay: float | None = None
    if attempt.outcome == "delivered":
        to = Notification.Status.DELIVERED
        updates.update(delivered_at=now, next_attempt_at=None)
    elif attempt.outcome == "dropped":
        to = Notification.Status.DROPPED
        updates.update(next_attempt_at=None)
    elif attempt.outcome == "retry" and row.attempts < row.max_attempts:
        delay = notification_backoff_s(row.attempts)
        to = Notification.Status.PENDING
        updates.update(next_attempt_at=now + timedelta(seconds=delay), job_id="")
    else:
        if attempt.outcome == "retry":
            updates["last_error"] = f"Gave up after {row.attempts} attempts: {attempt.error}"[:2000]
            attempt = Attempt("failed", attempt.error, attempt.status_code)
        to = Notification.Status.FAILED
        updates.update(next_attempt_at=None)
    # Fenced: a worker whose lease expired (and was replaced) records nothing, and is told so.
    recorded = try_compare_and_set(
        row,
        table=NOTIFICATION_TRANSITIONS,
        to=to,
        current=Notification.Status.SENDING,
        where={"lease_token": row.lease_token},
        updates=updates,
    )
    if recorded is None:
        log.warning("notifications.outcome_fenced", notification_id=row.pk, outcome=attempt.outcome)
        return "fenced"
    log_method = log.info if attempt.outcome == "delivered" else log.warning
    log_method(
        f"notifications.{attempt.outcome}",
        notification_id=row.pk,
        notification_event=row.event,
        channel=row.channel_name,
        attempt=row.attempts,
        error=attempt.error[:300],
    )
    if delay is not None:
        enqueue_delivery(notification_id=row.pk, delay_s=delay)
    return attempt.outcome


def _send(row: Notification) -> Attempt:
    channel = row.channel
    if channel is None and not row.env_target:
        return Attempt("failed", "The channel was deleted before the notification was sent.")
    if channel is not None and not channel.enabled and row.event != Event.TEST:
        return Attempt("failed", "The channel was disabled before the notification was sent.")
    if over := _no_longer_relevant(row):
        return Attempt("dropped", over)
    if row.kind == Kind.EMAIL:
        return _send_email(row, _recipients(row))
    if row.kind == Kind.SLACK:
        assert channel is not None  # environment channels are e-mail and webhooks
        return _post_checked(row, channel.target, _slack_body(row), headers={})
    if row.kind == Kind.TEAMS:
        assert channel is not None
        return _post_checked(row, channel.target, _teams_body(row), headers={})
    if row.kind == Kind.PAGERDUTY:
        assert channel is not None
        event = json.dumps(pagerduty.event_body(row, routing_key=channel.secret)).encode()
        if channel.target:
            # The tenant's own endpoint: checked again now, like a webhook's URL, and over TLS only.
            return _post_checked(row, channel.target, event, headers={}, tls=True)
        # The installation's (SAGA_PAGERDUTY_EVENTS_URL): the operator's, trusted.
        return _post_trusted(row, pagerduty.endpoint(channel), event, headers={})
    content = json.dumps(row.body, sort_keys=True).encode()
    secret = channel.secret if channel is not None else saga().notify_webhook_secret
    headers = dict(signed_headers(secret, content)) if secret else {}
    if channel is None:
        # An operator's own SAGA_NOTIFY_WEBHOOKS entry: trusted, like compensator webhooks.
        return _post_trusted(row, row.env_target, content, headers)
    return _post_checked(row, channel.target, content, headers=headers)


def _recipients(row: Notification) -> list[str]:
    if row.channel is not None:
        return [a.strip() for a in row.channel.target.split(",") if a.strip()]
    if row.env_target == Notification.PEOPLE:
        return [str(a) for a in row.context.get("recipients") or []]
    return list(saga().notify_emails)


def _no_longer_relevant(row: Notification) -> str:
    if (
        row.event == Event.COMMAND_OVERDUE
        and not AgentCommand.objects.filter(pk=row.subject_id, status=AgentCommand.Status.PENDING).exists()
    ):
        return "Not sent: the agent picked the resume up (or it was withdrawn) before this went out."
    if (
        row.event in (Event.APPROVAL_REMINDER, Event.APPROVAL_ESCALATED)
        and not Approval.objects.filter(pk=row.subject_id, status=Approval.Status.PENDING).exists()
    ):
        what = "reminder" if row.event == Event.APPROVAL_REMINDER else "escalation"
        return f"Not sent: the approval was decided (or expired) before the {what} went out."
    if row.kind == Kind.PAGERDUTY and pagerduty.resolved_since(row):
        return "Not sent: its PagerDuty incident was resolved before this went out."
    return ""


# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _email_text(row: Notification, *, decide: list[str] | None = None) -> tuple[str, str]:
    """Subject and text of the e-mail; ``decide``: one person's decision links
    (``recovery.notifications.email_links``), between the lines and the inbox's link."""
    body = row.body
    lines = [*(row.context.get("lines") or []), *(["", *decide] if decide else [])]
    summary = str(body.get("summary", row.event))
    # A header may not carry a line break (Django refuses "\r" and "\n" with BadHeaderError, which
    # would fail the job on every retry), and no other control character belongs there either.
    # Tool names cannot hold one any more (ledger.tool_names), but rows written before that rule,
    # and other text in a summary, still reach this point.
    subject = _CONTROL_CHARS.sub(" ", f"[Saga Admin] {summary}")[:250]
    text = "\n".join(
        [str(body.get("summary", "")), "", *map(str, lines), "", f"Open: {body.get('url', '')}", ""]
    )
    return subject, text


def _send_email(row: Notification, recipients: list[str]) -> Attempt:
    """One e-mail to the addresses of nobody who may decide (all of them, for anything but a
    waiting approval), and one of its own to each person who may (``recovery.notifications.email_links``),
    with their Approve and Reject links; all on one SMTP connection. A retry sends them all again
    (with new links; the old ones stay bound to the same person and approval)."""
    if not recipients:
        return Attempt("failed", "No e-mail address to send to.")
    subject, text = _email_text(row)
    approval = email_links.linked_approval(row)
    people = email_links.deciders(tenant_id=row.tenant_id, addresses=recipients) if approval else {}
    others = [address for address in recipients if address not in people]
    sender = settings.DEFAULT_FROM_EMAIL
    messages = [EmailMessage(subject, text, sender, others)] if others else []
    if approval is not None:
        for address, user_id in people.items():
            _, personal = _email_text(row, decide=email_links.decision_lines(approval, user_id=user_id))
            messages.append(EmailMessage(subject, personal, sender, [address]))
    try:
        get_connection(fail_silently=False).send_messages(messages)
    except (OSError, smtplib.SMTPException) as exc:
        if isinstance(exc, smtplib.SMTPRecipientsRefused):
            return Attempt("failed", f"Recipients refused: {exc}")
        return Attempt("retry", f"{type(exc).__name__}: {exc}")
    return Attempt("delivered")


def _slack_body(row: Notification) -> bytes:
    approval_id = str(row.context.get("approval_id") or "")
    buttons = bool(approval_id) and _slack_buttons_wanted(row, approval_id)
    message = slack.message(
        summary=str(row.body.get("summary", "")),
        url=str(row.body.get("url", "")),
        risk=row.risk,
        run_id=row.run_id,
        lines=[str(line) for line in row.context.get("lines") or []],
        tenant_slug=row.tenant.slug,
        approval_id=approval_id if buttons else "",
        args_hash=str(row.context.get("args_hash") or ""),
    )
    return json.dumps(message).encode()


# The events whose card offers Approve… and Reject… while the approval waits.
_TEAMS_DECIDING = (Event.APPROVAL_REQUESTED, Event.APPROVAL_REMINDER, Event.APPROVAL_ESCALATED)


def _teams_body(row: Notification) -> bytes:
    # Approve… and Reject… only while the approval can still be decided (pending, before its
    # deadline); a card sent later links to its page alone.
    approval_id = str(row.context.get("approval_id") or "")
    deciding = (
        bool(approval_id)
        and row.event in _TEAMS_DECIDING
        and Approval.objects.filter(
            pk=approval_id,
            tenant_id=row.tenant_id,
            status=Approval.Status.PENDING,
            expires_at__gt=timezone.now(),
        ).exists()
    )
    inbox = outbox.public_url(reverse("dashboard:approvals"))
    approve_url = reject_url = ""
    if deciding:
        approve_url = teams.decision_url(
            approvals_url=inbox, approval_id=approval_id, decide=teams.DECIDE_APPROVE
        )
        reject_url = teams.decision_url(
            approvals_url=inbox, approval_id=approval_id, decide=teams.DECIDE_REJECT
        )
    facts = [
        (str(pair[0]), str(pair[1]))
        for pair in row.context.get("facts") or []
        if isinstance(pair, list | tuple) and len(pair) == 2
    ]
    message = teams.message(
        summary=str(row.body.get("summary", "")),
        url=str(row.body.get("url", "")),
        risk=row.risk,
        run_id=row.run_id,
        lines=[str(line) for line in row.context.get("lines") or []],
        facts=facts,
        approve_url=approve_url,
        reject_url=reject_url,
    )
    return json.dumps(message).encode()


def _slack_buttons_wanted(row: Notification, approval_id: str) -> bool:
    # Buttons only where a press can be verified (the tenant connected a Slack app) and can still
    # decide something (the approval is pending).
    return (
        SlackApp.objects.filter(tenant_id=row.tenant_id).exists()
        and Approval.objects.filter(
            pk=approval_id, tenant_id=row.tenant_id, status=Approval.Status.PENDING
        ).exists()
    )


def _what(row: Notification) -> str:
    return {Kind.SLACK: "Slack", Kind.PAGERDUTY: "PagerDuty", Kind.TEAMS: "Teams"}.get(
        Kind(row.kind), "The webhook"
    )


def _answer(response: httpx.Response, *, what: str) -> Attempt:
    code = response.status_code
    if response.is_success:
        return Attempt("delivered", status_code=code)
    if response.is_redirect:
        location = response.headers.get("Location", "")
        return Attempt("failed", f"{what} answered {code} (redirect to {location!r}, not followed)", code)
    # PagerDuty says why it refused an event in JSON (400: invalid event, and its errors).
    detail = pagerduty.refusal_detail(response) if what == "PagerDuty" else response.text[:200].strip()
    error = f"{what} answered {code}" + (f": {detail}" if detail else "")
    # 4xx is the receiver saying no (a revoked Slack hook answers 404 or 410, a bad payload 400):
    # asking again changes nothing. 408 and 429 say "later"; 5xx may pass.
    if 400 <= code < 500 and code not in (408, 429):
        return Attempt("failed", error, code)
    return Attempt("retry", error, code)


def _post_checked(
    row: Notification, url: str, content: bytes, *, headers: dict[str, str], tls: bool = False
) -> Attempt:
    """A URL a tenant chose: checked again now (it may resolve elsewhere than when it was saved)
    and sent to the address the check approved, never following a redirect."""
    try:
        target = outbound.check_url(url, field="URL", tls=tls, owner=outbound.owner_of(row.tenant_id))
    except errors.UrlNotAllowed as exc:
        outcome = "retry" if exc.reason == outbound.UNRESOLVABLE else "failed"
        # Shown to the tenant's admins on the channel's deliveries, who chose the URL: why, in full.
        return Attempt(outcome, f"Refused: {exc.operator_message or exc.message}")
    all_headers = {"Content-Type": "application/json", "Idempotency-Key": row.pk, **headers}
    try:
        response = outbound.post(
            target, content=content, headers=all_headers, timeout=saga().webhook_timeout_s
        )
    except httpx.HTTPError as exc:
        return Attempt("retry", f"{type(exc).__name__}: {exc}")
    return _answer(response, what=_what(row))


def _post_trusted(row: Notification, url: str, content: bytes, headers: dict[str, str]) -> Attempt:
    all_headers = {"Content-Type": "application/json", "Idempotency-Key": row.pk, **headers}
    try:
        with deadline.client() as client:
            response = deadline.post(
                client, url, deadline_s=saga().webhook_timeout_s, content=content, headers=all_headers
            )
    except httpx.HTTPError as exc:
        return Attempt("retry", f"{type(exc).__name__}: {exc}")
    return _answer(response, what=_what(row))


# --- Answering a Slack interaction -----------------------------------------------------------


def slack_respond(*, response_url: str, message: dict[str, Any]) -> bool:
    """POST an answer to an interaction's ``response_url`` (a worker job): the approval's message
    replaced with the decision, or a refusal only the presser sees. The URL came in a request whose
    signature checked out, and goes through the outbound guard all the same."""
    try:
        # Slack's own hooks, from requests whose signature checked out: a share of their own.
        target = outbound.check_url(response_url, field="response_url", owner="slack:response_url")
        response = outbound.post(
            target,
            content=json.dumps(message).encode(),
            headers={"Content-Type": "application/json"},
            timeout=saga().webhook_timeout_s,
        )
    except (errors.UrlNotAllowed, httpx.HTTPError) as exc:
        log.warning("slack.respond_failed", error=str(exc))
        return False
    if not response.is_success:
        log.warning("slack.respond_failed", status=response.status_code)
    return response.is_success


def enqueue_slack_respond(*, response_url: str, message: dict[str, Any]) -> None:
    queueing.enqueue(
        "recovery.jobs.slack_respond", queue="notifications", response_url=response_url, message=message
    )
