"""Telling people and agents: notifications through an outbox, and resume/cancel commands pushed
to a run's resume_url. Never sent inside the request that caused them.

Notifications: ``notify`` writes one ``Notification`` row per channel that takes the event (the
tenant's channels, by their choice of events and minimum risk, and the environment's) in the same
transaction as the event; after commit a worker job (``notification_deliver``) claims the row by
compare-and-set, sends it (e-mail, signed webhook, Slack) and records the attempt; a failure that
may pass is retried with exponential backoff, and the sweeper re-enqueues rows whose job was lost
(Redis down when it was enqueued, a worker killed). So Redis or a channel being down delays a
notification and loses nothing.

Commands: ``delivered_at`` stays NULL until the agent's endpoint accepted one; the sweeper retries.
URLs a tenant or an agent chose (channels, resume_url) go through ``ledger.outbound`` (checked,
pinned, no redirects); the operator's own SAGA_NOTIFY_WEBHOOKS do not.
"""

from __future__ import annotations

import json
import re
import smtplib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import orjson
import structlog
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone
from saga_client.signing import signed_headers

from ledger import errors, outbound
from ledger.audit import Actor, audit_record
from ledger.conf import saga
from ledger.hashing import canonical_json_bytes
from ledger.models import Risk, Run, Tenant
from recovery import queueing, slack
from recovery.models import (
    AgentCommand,
    Approval,
    Notification,
    NotificationChannel,
    NotificationEvent,
    RecoveryItem,
    SlackApp,
    Unwind,
    UnwindStep,
)

log = structlog.get_logger("saga_admin.notifications")

# Pushes of one command to its resume_url; then the agent has to pull it. A refused URL is marked
# out of attempts at once.
MAX_DELIVERY_ATTEMPTS = 10


def _enqueue(func: Callable[..., object], **kwargs: Any) -> None:
    # The one way work reaches Redis (recovery.queueing): after commit, and a Redis outage is
    # logged there rather than turning a committed decision into a 500.
    queueing.enqueue(f"{__name__}.{func.__name__}", queue="notifications", **kwargs)


def enqueue_command_delivery(*, command_id: str) -> None:
    _enqueue(deliver_command, command_id=command_id)


# --- The outbox: raising a notification ------------------------------------------------------

Event = NotificationEvent
Kind = NotificationChannel.Kind
# How many attempts a row remembers (the dashboard's Notifications page shows them).
HISTORY_KEPT = 10


def public_url(path: str) -> str:
    """The link to a dashboard page in a notification: SAGA_PUBLIC_URL + the page's path."""
    return f"{saga().public_url}{path}"


def notify(
    *,
    tenant: Tenant,
    event: str,
    subject_id: str,
    run_id: str,
    summary: str,
    path: str,
    risk: str,
    lines: list[str] | None = None,
    approval_id: str = "",
    args_hash: str = "",
    channels: list[NotificationChannel] | None = None,
) -> list[Notification]:
    """Write one outbox row per channel that takes ``event`` at ``risk`` — the tenant's enabled
    channels (their choice of events and minimum risk) and the environment's (every event) — in
    the caller's transaction, and enqueue their delivery after it commits. ``channels``: exactly
    these channels and no environment ones (a test notification).

    The webhook body is fixed here, once for all its channels: ``{event, tenant, id, run_id,
    summary, url, created_at}`` with ``id`` the subject's (approval, item, step, unwind, command)."""
    now = timezone.now()
    body = {
        "event": event,
        "tenant": tenant.slug,
        "id": subject_id,
        "run_id": run_id,
        "summary": summary,
        "url": public_url(path),
        "created_at": now.isoformat(),
    }
    # ``args_hash``: the hash of the arguments ``lines`` show, which a Slack Approve button carries.
    context = {"lines": lines or [], "approval_id": approval_id, "args_hash": args_hash}
    common = {
        "tenant": tenant,
        "event": event,
        "subject_id": subject_id,
        "run_id": run_id,
        "risk": risk or Risk.LOW,
        "body": body,
        "context": context,
        "next_attempt_at": now,
        "max_attempts": saga().notify_max_attempts,
    }
    rows: list[Notification] = []
    chosen = (
        channels
        if channels is not None
        else list(NotificationChannel.objects.filter(tenant=tenant, enabled=True).order_by("name"))
    )
    for channel in chosen:
        if channels is not None or channel.wants(event, risk):
            rows.append(Notification(channel=channel, channel_name=channel.name, kind=channel.kind, **common))
    if channels is None:
        config = saga()
        if config.notify_emails:
            rows.append(
                Notification(channel_name="SAGA_NOTIFY_EMAILS", kind=Kind.EMAIL, env_target="email", **common)
            )
        for url in config.notify_webhooks:
            rows.append(
                Notification(
                    channel_name=f"SAGA_NOTIFY_WEBHOOKS {httpx.URL(url).host}",
                    kind=Kind.WEBHOOK,
                    env_target=url,
                    **common,
                )
            )
    if not rows:
        return rows
    Notification.objects.bulk_create(rows)
    ids = [row.pk for row in rows]

    def hand_over() -> None:
        for pk in ids:
            enqueue_delivery(notification_id=pk)

    transaction.on_commit(hand_over)
    return rows


def enqueue_delivery(*, notification_id: str, delay_s: float | None = None) -> None:
    """Hand one row to a worker (after commit). Redis down: logged, and the sweeper hands it again
    (``recovery.sweeper.notifications_sweep``); a second job for a row finds nothing to claim."""
    job_id = queueing.enqueue(
        "recovery.jobs.notification_deliver",
        queue="notifications",
        delay_s=delay_s,
        notification_id=notification_id,
    )
    if job_id:
        # Not a state change: remembers which job carries the row, for the sweeper.
        Notification.objects.filter(
            pk=notification_id, status__in=(Notification.Status.PENDING, Notification.Status.SENDING)
        ).update(job_id=job_id)


def notify_item_opened(item: RecoveryItem) -> list[Notification]:
    run = item.run
    tool = item.failed_action.tool if item.failed_action else ""
    lines = [
        f"Agent: {run.agent}",
        f"Request: {run.request}",
        f"Reason: {item.get_reason_display()}",
        f"Failed action: {tool or '(none)'}",
        f"Error: {item.error or '(none)'}",
        f"Suggested: {item.get_suggested_resolution_display()}",
    ]
    return notify(
        tenant=item.tenant,
        event=Event.RECOVERY_OPENED,
        subject_id=item.pk,
        run_id=run.pk,
        summary=f"{item.get_risk_display()} risk: run {run.pk} needs a decision ({item.get_reason_display()})",
        path=reverse("dashboard:run-detail", args=[run.pk]),
        risk=item.risk,
        lines=lines,
    )


# The most of an approval's args a notification spells out. Past it the text is cut (and says so):
# a message cannot show an approver a megabyte, a Slack message whose args were cut carries no
# Approve button (``recovery.slack``), and the inbox shows them whole. Well above Slack's own limit,
# so whatever is cut here is cut there too.
ARGS_SHOWN_MAX = 20_000


def args_shown(args: Any) -> str:
    """The args as a notification spells them: indented, keys sorted, cut past ``ARGS_SHOWN_MAX``
    characters. Their size is read from their canonical bytes first (orjson, a few milliseconds
    for a megabyte), so a near-limit body is never indented by the standard library."""
    if len(canonical_json_bytes(args)) <= ARGS_SHOWN_MAX:
        return json.dumps(args, indent=2, sort_keys=True, default=str)
    text = orjson.dumps(args, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS, default=str).decode()
    return f"{text[:ARGS_SHOWN_MAX]}\n… cut here ({len(text) - ARGS_SHOWN_MAX} more characters): the inbox shows them whole"


def approval_lines(approval: Approval) -> list[str]:
    """What a notification says of an approval: the args (a Slack Approve button is bound to their
    hash, ``approval.args_hash``, and offered only when they were not cut)."""
    return [
        f"{approval.get_kind_display()}: {approval.tool}",
        f"Expires: {approval.expires_at:%Y-%m-%d %H:%M} UTC",
        f"Args: {args_shown(approval.args)}",
    ]


def notify_approval_requested(approval: Approval) -> list[Notification]:
    return notify(
        tenant=approval.tenant,
        event=Event.APPROVAL_REQUESTED,
        subject_id=approval.pk,
        run_id=approval.run_id,
        summary=f"Approval needed: {approval.tool} ({approval.risk} risk) on run {approval.run_id}",
        path=f"{reverse('dashboard:approvals')}#approval-{approval.pk}",
        risk=approval.risk,
        lines=approval_lines(approval),
        approval_id=approval.pk,
        args_hash=approval.args_hash,
    )


def notify_approval_reminder(approval: Approval) -> list[Notification]:
    return notify(
        tenant=approval.tenant,
        event=Event.APPROVAL_REMINDER,
        subject_id=approval.pk,
        run_id=approval.run_id,
        summary=(
            f"Reminder: approval of {approval.tool} ({approval.risk} risk) on run {approval.run_id} "
            f"expires at {approval.expires_at:%Y-%m-%d %H:%M} UTC"
        ),
        path=f"{reverse('dashboard:approvals')}#approval-{approval.pk}",
        risk=approval.risk,
        lines=approval_lines(approval),
        approval_id=approval.pk,
        args_hash=approval.args_hash,
    )


def notify_step_failed(step: UnwindStep, *, run: Run, risk: str) -> list[Notification]:
    return notify(
        tenant=run.tenant,
        event=Event.STEP_FAILED,
        subject_id=step.pk,
        run_id=run.pk,
        summary=f"Compensation step {step.tool or step.action.tool} {step.status} on run {run.pk}",
        path=f"{reverse('dashboard:run-detail', args=[run.pk])}#unwind",
        risk=risk,
        lines=[
            f"Undoing: {step.action.tool} (action {step.action_id})",
            f"Attempts: {step.attempts}",
            f"Error: {step.error or '(none)'}",
        ],
    )


def notify_unwind_finished(unwind: Unwind, *, run: Run, summary: str, risk: str) -> list[Notification]:
    outcome = "compensated" if unwind.status == Unwind.Status.COMPLETED else "finished with steps left"
    return notify(
        tenant=run.tenant,
        event=Event.UNWIND_FINISHED,
        subject_id=unwind.pk,
        run_id=run.pk,
        summary=f"Run {run.pk} {outcome}",
        path=f"{reverse('dashboard:run-detail', args=[run.pk])}#unwind",
        risk=risk,
        lines=[f"Agent: {run.agent}", f"Request: {run.request}", f"Unwind: {summary}"],
    )


def notify_command_overdue(command: AgentCommand) -> list[Notification]:
    run = command.run
    now = timezone.now()
    waited_min = max(1, round((now - command.created_at).total_seconds() / 60))
    heard_at = run.last_heartbeat_at or run.created_at
    alive = (
        f"The agent is alive (last heartbeat {heard_at:%H:%M:%S} UTC) and was handed the command."
        if heard_at > command.created_at
        else f"The agent has not been heard from since {heard_at:%Y-%m-%d %H:%M:%S} UTC."
    )
    return notify(
        tenant=run.tenant,
        event=Event.COMMAND_OVERDUE,
        subject_id=command.pk,
        run_id=run.pk,
        summary=f"Resume of run {run.pk} not picked up after {waited_min} min",
        path=reverse("dashboard:run-detail", args=[run.pk]),
        risk=Risk.LOW,
        lines=[
            f"Run {run.pk} of agent {run.agent} was resumed by {command.issued_by()} at "
            f"{command.created_at:%Y-%m-%d %H:%M} UTC and its agent has not acknowledged the command.",
            f"Request: {run.request}",
            alive,
            f"If it stays silent for {saga().heartbeat_timeout_s} s the run comes back to the recovery "
            "queue as agent lost and waits for a person (it is not compensated automatically).",
        ],
    )


# --- The outbox: delivering one row ----------------------------------------------------------


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
    claimed = (
        Notification.objects.filter(pk=notification_id, attempts__lt=F("max_attempts"))
        .filter(
            Q(status=Notification.Status.PENDING, next_attempt_at__lte=now)
            | Q(status=Notification.Status.SENDING, lease_expires_at__lt=now)
        )
        .update(
            status=Notification.Status.SENDING,
            attempts=F("attempts") + 1,
            lease_token=F("lease_token") + 1,
            lease_expires_at=now + timedelta(seconds=_lease_s()),
            updated_at=now,
        )
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
        updates.update(status=Notification.Status.DELIVERED, delivered_at=now, next_attempt_at=None)
    elif attempt.outcome == "dropped":
        updates.update(status=Notification.Status.DROPPED, next_attempt_at=None)
    elif attempt.outcome == "retry" and row.attempts < row.max_attempts:
        delay = notification_backoff_s(row.attempts)
        updates.update(
            status=Notification.Status.PENDING, next_attempt_at=now + timedelta(seconds=delay), job_id=""
        )
    else:
        if attempt.outcome == "retry":
            updates["last_error"] = f"Gave up after {row.attempts} attempts: {attempt.error}"[:2000]
            attempt = Attempt("failed", attempt.error, attempt.status_code)
        updates.update(status=Notification.Status.FAILED, next_attempt_at=None)
    # Fenced: a worker whose lease expired (and was replaced) records nothing.
    recorded = Notification.objects.filter(
        pk=row.pk, status=Notification.Status.SENDING, lease_token=row.lease_token
    ).update(**updates)
    if recorded != 1:
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
        recipients = (
            [a.strip() for a in channel.target.split(",") if a.strip()]
            if channel is not None
            else list(saga().notify_emails)
        )
        return _send_email(row, recipients)
    if row.kind == Kind.SLACK:
        assert channel is not None  # environment channels are e-mail and webhooks
        return _post_checked(row, channel.target, _slack_body(row), headers={})
    content = json.dumps(row.body, sort_keys=True).encode()
    secret = channel.secret if channel is not None else saga().notify_webhook_secret
    headers = dict(signed_headers(secret, content)) if secret else {}
    if channel is None:
        # An operator's own SAGA_NOTIFY_WEBHOOKS entry: trusted, like compensator webhooks.
        return _post_trusted(row, row.env_target, content, headers)
    return _post_checked(row, channel.target, content, headers=headers)


def _no_longer_relevant(row: Notification) -> str:
    if (
        row.event == Event.COMMAND_OVERDUE
        and not AgentCommand.objects.filter(pk=row.subject_id, status=AgentCommand.Status.PENDING).exists()
    ):
        return "Not sent: the agent picked the resume up (or it was withdrawn) before this went out."
    if (
        row.event == Event.APPROVAL_REMINDER
        and not Approval.objects.filter(pk=row.subject_id, status=Approval.Status.PENDING).exists()
    ):
        return "Not sent: the approval was decided (or expired) before the reminder went out."
    return ""


# C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _email_text(row: Notification) -> tuple[str, str]:
    body = row.body
    lines = row.context.get("lines") or []
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
    if not recipients:
        return Attempt("failed", "No e-mail address to send to.")
    subject, text = _email_text(row)
    try:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)
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


def _slack_buttons_wanted(row: Notification, approval_id: str) -> bool:
    # Buttons only where a press can be verified (the tenant connected a Slack app) and can still
    # decide something (the approval is pending).
    return (
        SlackApp.objects.filter(tenant_id=row.tenant_id).exists()
        and Approval.objects.filter(
            pk=approval_id, tenant_id=row.tenant_id, status=Approval.Status.PENDING
        ).exists()
    )


def _answer(response: httpx.Response, *, what: str) -> Attempt:
    code = response.status_code
    if response.is_success:
        return Attempt("delivered", status_code=code)
    if response.is_redirect:
        location = response.headers.get("Location", "")
        return Attempt("failed", f"{what} answered {code} (redirect to {location!r}, not followed)", code)
    detail = response.text[:200].strip()
    error = f"{what} answered {code}" + (f": {detail}" if detail else "")
    # 4xx is the receiver saying no (a revoked Slack hook answers 404 or 410, a bad payload 400):
    # asking again changes nothing. 408 and 429 say "later"; 5xx may pass.
    if 400 <= code < 500 and code not in (408, 429):
        return Attempt("failed", error, code)
    return Attempt("retry", error, code)


def _post_checked(row: Notification, url: str, content: bytes, *, headers: dict[str, str]) -> Attempt:
    """A URL a tenant chose: checked again now (it may resolve elsewhere than when it was saved)
    and sent to the address the check approved, never following a redirect."""
    try:
        target = outbound.check_url(url, field="URL")
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
    return _answer(response, what="Slack" if row.kind == Kind.SLACK else "The webhook")


def _post_trusted(row: Notification, url: str, content: bytes, headers: dict[str, str]) -> Attempt:
    all_headers = {"Content-Type": "application/json", "Idempotency-Key": row.pk, **headers}
    try:
        response = httpx.post(url, content=content, headers=all_headers, timeout=saga().webhook_timeout_s)
    except httpx.HTTPError as exc:
        return Attempt("retry", f"{type(exc).__name__}: {exc}")
    return _answer(response, what="The webhook")


# --- Answering a Slack interaction -----------------------------------------------------------


def slack_respond(*, response_url: str, message: dict[str, Any]) -> bool:
    """POST an answer to an interaction's ``response_url`` (a worker job): the approval's message
    replaced with the decision, or a refusal only the presser sees. The URL came in a request whose
    signature checked out, and goes through the outbound guard all the same."""
    try:
        target = outbound.check_url(response_url, field="response_url")
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


def deliver_command(*, command_id: str) -> bool:
    """POST a resume/cancel command to the run's resume_url, signed with the run's agent's own
    resume secret (``ledger.outbound.resume_secret``: per tenant and agent). The signed body names
    the tenant, the agent, the run and the destination (``url``), so a receiver that checks them
    (``saga_client.verify_signature(..., url=...)``) accepts neither another agent's command nor one
    captured on its way to another URL. Returns True when delivered (or nothing to do).

    The URL is checked again here, and the request goes to the address this check approved
    (``ledger.outbound.post``): a name that resolved to a public address when the run was created
    and to an internal one now is refused. A refusal is final — recorded on the command, audited on
    the run, never retried (the agent can still pull the command). A failure that may pass (the
    endpoint is down or answered non-2xx, a redirect included, or the name does not resolve right
    now) is recorded and the sweeper retries, a bounded number of times."""
    command = AgentCommand.objects.select_related("run", "tenant", "checkpoint").filter(pk=command_id).first()
    if command is None or command.delivered_at is not None or not command.run.resume_url:
        return True
    if command.status == AgentCommand.Status.CANCELLED:
        return True  # withdrawn before it got there: the agent must not act on it
    if command.delivery_attempts >= MAX_DELIVERY_ATTEMPTS:
        return False  # refused, or out of attempts: a stray job changes nothing
    agent = outbound.run_agent(command.run)
    payload = {
        "command_id": command.pk,
        "kind": command.kind,
        "run_id": command.run_id,
        "tenant": command.tenant.slug,
        "agent": agent,
        "url": command.run.resume_url,
        "checkpoint_id": command.checkpoint_id,
        "checkpoint": command.checkpoint.state if command.checkpoint else None,
        "reason": command.reason,
        "created_at": command.created_at.isoformat(),
    }
    target: outbound.CheckedUrl | None = None
    try:
        target = outbound.check_url(command.run.resume_url, field="resume_url")
    except errors.UrlNotAllowed as exc:
        if exc.reason != outbound.UNRESOLVABLE:
            _delivery_refused(command, exc)
            return False
        # The agent reads delivery_error: it is told what any refusal tells it, nothing more; the
        # operator's log line has why.
        unresolved = exc.message
        log.warning("commands.resume_url_unresolvable", command_id=command.pk, reason=exc.operator_message)
    AgentCommand.objects.filter(pk=command.pk).update(delivery_attempts=F("delivery_attempts") + 1)
    if target is None:
        return _delivery_failed(command, unresolved)
    body = json.dumps(payload, sort_keys=True, default=str).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": command.pk}
    secret = outbound.resume_secret(command.tenant, agent)
    if secret:
        headers.update(signed_headers(secret, body))
    try:
        response = outbound.post(target, content=body, headers=headers, timeout=saga().webhook_timeout_s)
    except httpx.HTTPError as exc:
        return _delivery_failed(command, f"{type(exc).__name__}: {exc}")
    if response.is_redirect:
        # Redirects are never followed: the agent's URL is where commands go, not where it points.
        location = response.headers.get("Location", "")
        return _delivery_failed(
            command, f"resume_url answered {response.status_code} (redirect to {location!r}, not followed)"
        )
    if not response.is_success:
        return _delivery_failed(command, f"resume_url answered {response.status_code}")
    AgentCommand.objects.filter(pk=command.pk).update(delivered_at=timezone.now(), delivery_error="")
    return True


def _delivery_failed(command: AgentCommand, error: str) -> bool:
    AgentCommand.objects.filter(pk=command.pk).update(delivery_error=error[:2000])
    log.warning("commands.delivery_failed", command_id=command.pk, error=error[:500])
    return False


def _delivery_refused(command: AgentCommand, refusal: errors.UrlNotAllowed) -> None:
    """The run's resume_url may not be reached: no more attempts (the sweeper skips a command out
    of attempts), the reason on the command, and a ``command.delivery_refused`` event on the run."""
    with transaction.atomic():
        refused = AgentCommand.objects.filter(
            pk=command.pk, delivered_at__isnull=True, delivery_attempts__lt=MAX_DELIVERY_ATTEMPTS
        ).update(delivery_attempts=MAX_DELIVERY_ATTEMPTS, delivery_error=f"Refused: {refusal.message}"[:2000])
        if refused != 1:
            return  # another job got there first
        audit_record(
            tenant=command.tenant,
            run=command.run,
            actor=Actor.system("notifications"),
            kind="command.delivery_refused",
            subject=command,
            # The operator's record says why; the command (which its agent reads) does not.
            reason=refusal.operator_message,
            data=refusal.audit_data(),
        )
    log.warning(
        "commands.delivery_refused",
        command_id=command.pk,
        run_id=command.run_id,
        reason=refusal.reason,
    )
