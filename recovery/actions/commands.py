"""Agent commands: resume and cancel orders for a run's agent, pulled on heartbeat (or GET
commands) and pushed to the run's ``resume_url`` when it has one, by a job after commit; pushes
that did not get through are retried by the sweeper a bounded number of times."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from infra import errors
from infra.conf import saga
from ledger.audit import Actor, audit_record
from ledger.models import Checkpoint, Run
from ledger.transitions import try_compare_and_set
from recovery.models import AgentCommand
from recovery.notifications import command_push, outbox

MAX_COMMAND_DELIVERY_ATTEMPTS = command_push.MAX_DELIVERY_ATTEMPTS
COMMAND_MONITOR = Actor.system("command-monitor")

# A command waits for its agent until the agent acknowledges it, or it is withdrawn first (the
# run ended, was cancelled or failed again). Whichever comes first wins; the other changes
# nothing (an agent acknowledging a withdrawn command, or one it acknowledged already).
COMMAND_TRANSITIONS: dict[str, set[str]] = {
    AgentCommand.Status.PENDING: {AgentCommand.Status.ACKED, AgentCommand.Status.CANCELLED},
    AgentCommand.Status.ACKED: set(),
    AgentCommand.Status.CANCELLED: set(),
}


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
        transaction.on_commit(lambda: command_push.enqueue_command_delivery(command_id=command.pk))
    return command


@transaction.atomic
def command_ack(*, command: AgentCommand, actor: Actor) -> AgentCommand:
    """pending → acked. Acknowledging twice is harmless (agents retry)."""
    # A lost race (acknowledged already, or withdrawn) is no error: agents retry.
    acked = try_compare_and_set(
        command, table=COMMAND_TRANSITIONS, to=AgentCommand.Status.ACKED, updates={"acked_at": timezone.now()}
    )
    command.refresh_from_db()
    if acked is not None:
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


def commands_redeliver(*, now: datetime | None = None) -> int:
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
        command_push.enqueue_command_delivery(command_id=command_id)
        count += 1
    return count


@transaction.atomic
def commands_cancel_pending(
    *, run: Run, actor: Actor, reason: str, kinds: Iterable[str] = (AgentCommand.Kind.RESUME,)
) -> list[AgentCommand]:
    """pending → cancelled for the run's commands of ``kinds`` its agent has not acknowledged:
    the run ended, was cancelled or failed again, so the order no longer stands. Each is audited
    (``command.cancelled``); an agent pulls only pending commands, and acknowledging a cancelled
    one changes nothing. The caller holds the run's row lock. Returns the commands cancelled."""
    now = timezone.now()
    cancelled = []
    for command in AgentCommand.objects.filter(
        run_id=run.pk, status=AgentCommand.Status.PENDING, kind__in=list(kinds)
    ).order_by("created_at"):
        # An acknowledgement that got there first wins (the agent has it).
        if (
            try_compare_and_set(
                command,
                table=COMMAND_TRANSITIONS,
                to=AgentCommand.Status.CANCELLED,
                updates={"cancelled_at": now},
            )
            is None
        ):
            continue
        audit_record(
            tenant=run.tenant,
            run=run,
            actor=actor,
            kind="command.cancelled",
            subject=command,
            from_state=AgentCommand.Status.PENDING,
            to_state=AgentCommand.Status.CANCELLED,
            reason=reason,
            data={"command_kind": command.kind, "issued_at": command.created_at.isoformat()},
        )
        cancelled.append(command)
    return cancelled


def overdue_before(now: datetime) -> datetime:
    """A resume command issued before this and still not acknowledged is overdue (the one rule
    for the sweeper, the dashboard and the notification)."""
    return now - timedelta(seconds=saga().resume_ack_timeout_s)


@dataclass(frozen=True)
class AgentPulse:
    """When a run's agent was last heard from: its last heartbeat (the run's start when it has
    sent none), and whether that is longer ago than the heartbeat timeout."""

    heard_at: datetime
    silent_s: int
    timeout_s: int

    @property
    def silent(self) -> bool:
        return self.silent_s > self.timeout_s


def agent_pulse(*, run: Run, now: datetime | None = None) -> AgentPulse:
    now = now or timezone.now()
    heard_at = run.last_heartbeat_at or run.created_at
    return AgentPulse(
        heard_at=heard_at,
        silent_s=max(0, int((now - heard_at).total_seconds())),
        timeout_s=saga().heartbeat_timeout_s,
    )


@dataclass(frozen=True)
class ResumeWait:
    """A resume command the run's agent has not acknowledged yet."""

    command: AgentCommand
    issued_by: str
    waited_s: int
    overdue: bool
    # The agent sent a heartbeat after the command was issued: it was handed the command (a
    # heartbeat answers with the pending commands) but has not acknowledged it.
    heard_since: bool


def resume_waiting(*, run: Run, now: datetime | None = None) -> ResumeWait | None:
    """The run's oldest pending resume command, with how long it has waited."""
    now = now or timezone.now()
    command = (
        AgentCommand.objects.filter(
            run_id=run.pk, kind=AgentCommand.Kind.RESUME, status=AgentCommand.Status.PENDING
        )
        .select_related("created_by")
        .order_by("created_at")
        .first()
    )
    if command is None:
        return None
    return ResumeWait(
        command=command,
        issued_by=command.issued_by(),
        waited_s=max(0, int((now - command.created_at).total_seconds())),
        overdue=command.created_at < overdue_before(now),
        heard_since=run.last_heartbeat_at is not None and run.last_heartbeat_at > command.created_at,
    )


def commands_flag_overdue(*, now: datetime | None = None) -> int:
    """Resume commands their agent has not acknowledged within SAGA RESUME_ACK_TIMEOUT_S: each is
    audited on its run (``command.overdue``) and announced (e-mail, webhooks) once — marked by
    ``overdue_notified_at`` in the same transaction, so two sweepers announce it once. The command
    stays pending: the agent may still come back and pick it up."""
    now = now or timezone.now()
    due = AgentCommand.objects.filter(
        kind=AgentCommand.Kind.RESUME,
        status=AgentCommand.Status.PENDING,
        overdue_notified_at__isnull=True,
        created_at__lt=overdue_before(now),
    ).values_list("pk", flat=True)
    flagged = 0
    for command_id in list(due):
        with transaction.atomic():
            if (
                AgentCommand.objects.filter(
                    pk=command_id, status=AgentCommand.Status.PENDING, overdue_notified_at__isnull=True
                ).update(overdue_notified_at=now)
                != 1
            ):
                continue  # acknowledged or cancelled meanwhile, or another sweeper has it
            command = AgentCommand.objects.select_related("run__tenant").get(pk=command_id)
            waited_min = max(1, round((now - command.created_at).total_seconds() / 60))
            audit_record(
                tenant=command.run.tenant,
                run=command.run,
                actor=COMMAND_MONITOR,
                kind="command.overdue",
                subject=command,
                from_state=command.status,
                to_state=command.status,
                reason=f"The agent has not acknowledged the resume command {waited_min} min after it was issued.",
                data={"issued_at": command.created_at.isoformat(), "timeout_s": saga().resume_ack_timeout_s},
            )
            outbox.notify_command_overdue(command)
            flagged += 1
    return flagged
