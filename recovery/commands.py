"""Agent commands: resume and cancel orders for a run's agent, pulled on heartbeat (or GET
commands) and pushed to the run's ``resume_url`` when it has one, by a job after commit; pushes
that did not get through are retried by the sweeper a bounded number of times."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from ledger import errors
from ledger.audit import Actor, audit_record
from ledger.conf import saga
from ledger.models import Checkpoint, Run
from recovery import notifications
from recovery.models import AgentCommand

MAX_COMMAND_DELIVERY_ATTEMPTS = notifications.MAX_DELIVERY_ATTEMPTS


@transaction.atomic
def command_issue(
    *, run: Run, kind: str, actor: Actor, reason: str, checkpoint: Checkpoint | None = None
) -> AgentCommand:
    """Queue a resume/cancel command for the agent: it is pulled (GET commands, heartbeat) and,
    when the run has a resume_url, pushed there by a job after commit."""
    if kind not in AgentCommand.Kind.values:
        raise errors.ValidationFailed(f"Unknown command kind {kind!r}.", details={"kind": kind})
    command = AgentCommand.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        kind=kind,
        checkpoint=checkpoint,
        reason=reason,
        created_by=actor.user,
    )
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind=f"command.{kind}",
        subject=command,
        reason=reason,
        to_state=command.status,
        data={"checkpoint": getattr(checkpoint, "pk", None)},
    )
    if run.resume_url:
        transaction.on_commit(lambda: notifications.enqueue_command_delivery(command_id=command.pk))
    return command


@transaction.atomic
def command_ack(*, command: AgentCommand, actor: Actor) -> AgentCommand:
    """pending → acked. Acknowledging twice is harmless (agents retry)."""
    updated = AgentCommand.objects.filter(pk=command.pk, status=AgentCommand.Status.PENDING).update(
        status=AgentCommand.Status.ACKED, acked_at=timezone.now()
    )
    command.refresh_from_db()
    if updated:
        audit_record(
            tenant=command.run.tenant,
            run=command.run,
            actor=actor,
            kind="command.acked",
            subject=command,
            from_state=AgentCommand.Status.PENDING,
            to_state=AgentCommand.Status.ACKED,
        )
    return command


def commands_redeliver_due(*, now: datetime | None = None) -> int:
    """Commands for runs with a resume_url that their endpoint has not accepted yet (the first
    push failed, or Redis was down when it was to be sent) are pushed again, a bounded number of
    times; agents can always pull them regardless. A command whose URL was refused counts as out
    of attempts and is not pushed again."""
    now = now or timezone.now()
    settle = timedelta(seconds=saga().sweep_interval_s)
    due = (
        AgentCommand.objects.filter(
            status=AgentCommand.Status.PENDING,
            delivered_at__isnull=True,
            created_at__lt=now - settle,
            delivery_attempts__lt=MAX_COMMAND_DELIVERY_ATTEMPTS,
        )
        .exclude(run__resume_url="")
        .values_list("pk", flat=True)
    )
    count = 0
    for command_id in due:
        notifications.enqueue_command_delivery(command_id=command_id)
        count += 1
    return count
