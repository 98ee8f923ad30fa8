"""Pushing resume and cancel commands to a run's resume_url, signed with the run's agent's own
secret. ``delivered_at`` stays NULL until the agent's endpoint accepted one; the sweeper retries
(``recovery.actions.commands.commands_redeliver``). The URL an agent chose goes through
``infra.outbound`` (checked, pinned, no redirects), and a refused one is final.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import structlog
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from infra import errors, outbound
from infra.conf import saga
from infra.signing import signed_headers
from ledger import resume_secrets
from ledger.audit import Actor, audit_record
from recovery import queueing
from recovery.models import AgentCommand

log = structlog.get_logger(__name__)


# Pushes of one command to its resume_url; then the agent has to pull it. A refused URL is marked
# out of attempts at once.
MAX_DELIVERY_ATTEMPTS = 10


def _enqueue(func: Callable[..., object], **kwargs: Any) -> None:
    # The one way work reaches Redis (recovery.queueing): after commit, and a Redis outage is
    # logged there rather than turning a committed decision into a 500.
    queueing.enqueue(f"{__name__}.{func.__name__}", queue="notifications", **kwargs)


def enqueue_command_delivery(*, command_id: str) -> None:
    _enqueue(deliver_command, command_id=command_id)


def deliver_command(*, command_id: str) -> bool:
    """POST a resume/cancel command to the run's resume_url, signed with the run's agent's own
    resume secret (``ledger.resume_secrets.resume_secret``: per tenant and agent). The signed body names
    the tenant, the agent, the run and the destination (``url``), so a receiver that checks them
    (``saga_client.verify_signature(..., url=...)``) accepts neither another agent's command nor one
    captured on its way to another URL. Returns True when delivered (or nothing to do).

    The URL is checked again here, and the request goes to the address this check approved
    (``infra.outbound.post``): a name that resolved to a public address when the run was created
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
    agent = resume_secrets.run_agent(command.run)
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
        target = outbound.check_url(
            command.run.resume_url, field="resume_url", owner=outbound.owner_of(command.tenant_id)
        )
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
    return _command_post(command, target, payload=payload, agent=agent)


def _command_post(
    command: AgentCommand, target: outbound.CheckedUrl, *, payload: dict[str, Any], agent: str
) -> bool:
    """Send the command, signed, to the address the check approved, and record what came of it
    (``deliver_command``)."""
    body = json.dumps(payload, sort_keys=True, default=str).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": command.pk}
    secret = resume_secrets.resume_secret(command.tenant, agent)
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
