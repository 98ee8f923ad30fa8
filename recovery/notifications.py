"""Telling people and agents: new recovery items and approvals (e-mail and signed webhooks), and
resume/cancel commands pushed to a run's resume_url. Always from an RQ job, never inside the
request that caused it.

Enqueueing happens after commit. If Redis is down at that moment the decision is already safe in
PostgreSQL; notifications are best-effort and logged, while command delivery is retried by the
sweeper (``delivered_at`` stays NULL until the agent's endpoint accepted it). A resume_url is a URL
an agent chose: it goes through ``ledger.outbound`` (checked, pinned, no redirects); the
operator's own notification webhooks do not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import structlog
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import F
from django.utils import timezone
from saga_client.signing import signed_headers

from ledger import errors, outbound
from ledger.audit import Actor, audit_record
from ledger.conf import saga
from recovery import queueing
from recovery.models import AgentCommand, Approval, RecoveryItem

log = structlog.get_logger("saga_admin.notifications")

# Pushes of one command to its resume_url; then the agent has to pull it. A refused URL is marked
# out of attempts at once.
MAX_DELIVERY_ATTEMPTS = 10


def _enqueue(func: Callable[..., object], **kwargs: Any) -> None:
    # The one way work reaches Redis (recovery.queueing): after commit, and a Redis outage is
    # logged there rather than turning a committed decision into a 500.
    queueing.enqueue(f"{__name__}.{func.__name__}", queue="notifications", **kwargs)


def enqueue_item_opened(*, item_id: str) -> None:
    _enqueue(send_item_opened, item_id=item_id)


def enqueue_approval_requested(*, approval_id: str) -> None:
    _enqueue(send_approval_requested, approval_id=approval_id)


def enqueue_command_delivery(*, command_id: str) -> None:
    _enqueue(deliver_command, command_id=command_id)


def enqueue_command_overdue(*, command_id: str) -> None:
    _enqueue(send_command_overdue, command_id=command_id)


def _post_signed(url: str, payload: dict[str, Any], *, secret: str, idempotency_key: str) -> httpx.Response:
    body = json.dumps(payload, sort_keys=True, default=str).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key}
    if secret:
        headers.update(signed_headers(secret, body))
    return httpx.post(url, content=body, headers=headers, timeout=saga().webhook_timeout_s)


def _broadcast(*, subject: str, text: str, payload: dict[str, Any], idempotency_key: str) -> None:
    config = saga()
    if config.notify_emails:
        send_mail(subject, text, settings.DEFAULT_FROM_EMAIL, list(config.notify_emails), fail_silently=False)
    for url in config.notify_webhooks:
        try:
            response = _post_signed(
                url, payload, secret=config.notify_webhook_secret, idempotency_key=idempotency_key
            )
            response.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("notifications.webhook_failed", url=url, error=str(exc))


def send_item_opened(*, item_id: str) -> None:
    item = RecoveryItem.objects.select_related("run", "tenant", "failed_action").filter(pk=item_id).first()
    if item is None:
        return
    tool = item.failed_action.tool if item.failed_action else "(no action)"
    subject = (
        f"[Saga Admin] {item.get_risk_display()} risk: run {item.run_id} needs a decision ({item.reason})"
    )
    text = (
        f"Run {item.run_id} of agent {item.run.agent} ({item.tenant.slug}) landed in the recovery queue.\n"
        f"Request: {item.run.request}\nReason: {item.get_reason_display()}\nFailed action: {tool}\n"
        f"Error: {item.error}\nSuggested: {item.get_suggested_resolution_display()}\n"
    )
    payload = {
        "event": "recovery_item.opened",
        "item_id": item.pk,
        "run_id": item.run_id,
        "tenant": item.tenant.slug,
        "reason": item.reason,
        "risk": item.risk,
        "tool": tool,
        "error": item.error,
    }
    _broadcast(subject=subject, text=text, payload=payload, idempotency_key=f"notify-{item.pk}")


def send_approval_requested(*, approval_id: str) -> None:
    approval = Approval.objects.select_related("run", "tenant").filter(pk=approval_id).first()
    if approval is None:
        return
    subject = f"[Saga Admin] approval needed: {approval.tool} ({approval.risk})"
    text = (
        f"{approval.get_kind_display()} {approval.tool} on run {approval.run_id} ({approval.tenant.slug}) needs "
        f"approval before {approval.expires_at:%Y-%m-%d %H:%M} UTC.\nArgs: {json.dumps(approval.args, indent=2)}\n"
    )
    payload = {
        "event": "approval.requested",
        "approval_id": approval.pk,
        "run_id": approval.run_id,
        "tenant": approval.tenant.slug,
        "tool": approval.tool,
        "risk": approval.risk,
        "expires_at": approval.expires_at.isoformat(),
    }
    _broadcast(subject=subject, text=text, payload=payload, idempotency_key=f"notify-{approval.pk}")


def send_command_overdue(*, command_id: str) -> None:
    """A resume command its agent has not acknowledged in time (``commands.commands_flag_overdue``
    enqueues this once per command). Nothing is sent when it was picked up or withdrawn since."""
    command = AgentCommand.objects.select_related("run", "tenant", "created_by").filter(pk=command_id).first()
    if command is None or command.status != AgentCommand.Status.PENDING:
        return
    run = command.run
    waited_min = max(1, round((timezone.now() - command.created_at).total_seconds() / 60))
    issued_by = command.issued_by()
    heard_at = run.last_heartbeat_at or run.created_at
    heard_since = heard_at > command.created_at
    subject = f"[Saga Admin] resume of run {run.pk} not picked up after {waited_min} min"
    text = (
        f"Run {run.pk} of agent {run.agent} ({command.tenant.slug}) was resumed by {issued_by} at "
        f"{command.created_at:%Y-%m-%d %H:%M} UTC and its agent has not acknowledged the command.\n"
        f"Request: {run.request}\n"
        + (
            f"The agent is alive (last heartbeat {heard_at:%H:%M:%S} UTC) and was handed the command.\n"
            if heard_since
            else f"The agent has not been heard from since {heard_at:%Y-%m-%d %H:%M:%S} UTC.\n"
        )
        + f"If it stays silent for {saga().heartbeat_timeout_s} s the run comes back to the recovery "
        "queue as agent lost and waits for a person (it is not compensated automatically).\n"
    )
    payload = {
        "event": "command.overdue",
        "command_id": command.pk,
        "kind": command.kind,
        "run_id": run.pk,
        "tenant": command.tenant.slug,
        "issued_by": issued_by,
        "issued_at": command.created_at.isoformat(),
        "last_heartbeat_at": heard_at.isoformat(),
    }
    _broadcast(subject=subject, text=text, payload=payload, idempotency_key=f"notify-{command.pk}-overdue")


def deliver_command(*, command_id: str) -> bool:
    """POST a resume/cancel command to the run's resume_url, signed with the tenant's own resume
    secret (``ledger.outbound.resume_secret``). Returns True when delivered (or nothing to do).

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
    payload = {
        "command_id": command.pk,
        "kind": command.kind,
        "run_id": command.run_id,
        "tenant": command.tenant.slug,
        "checkpoint_id": command.checkpoint_id,
        "checkpoint": command.checkpoint.state if command.checkpoint else None,
        "reason": command.reason,
        "created_at": command.created_at.isoformat(),
    }
    target: outbound.CheckedUrl | None = None
    try:
        target = outbound.check_url(command.run.resume_url, field="resume_url")
    except errors.UrlNotAllowed as exc:
        if exc.details.get("reason") != outbound.UNRESOLVABLE:
            _delivery_refused(command, exc)
            return False
        unresolved = exc.message
    AgentCommand.objects.filter(pk=command.pk).update(delivery_attempts=F("delivery_attempts") + 1)
    if target is None:
        return _delivery_failed(command, unresolved)
    body = json.dumps(payload, sort_keys=True, default=str).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": command.pk}
    secret = outbound.resume_secret(command.tenant)
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
            reason=refusal.message,
            data={"code": refusal.code, **refusal.details, "address": refusal.resolved_address},
        )
    log.warning(
        "commands.delivery_refused",
        command_id=command.pk,
        run_id=command.run_id,
        reason=refusal.details.get("reason", ""),
    )
