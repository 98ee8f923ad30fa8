"""The periodic duties that decide (worker jobs): escalating and expiring approvals past their deadline, and
failing the runs whose agent is lost.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from infra.conf import saga
from ledger.audit import Actor
from ledger.models import Run
from recovery import approval_deadlines
from recovery.actions.approvals import approval_settle
from recovery.actions.reports import run_fail_and_queue
from recovery.models import AgentCommand, Approval
from recovery.notifications import outbox
from recovery.transitions import approvals

log = structlog.get_logger(__name__)


def approvals_expire(*, now: datetime | None = None) -> int:
    """Keep the approval deadlines (a periodic job; ``recovery.approval_deadlines``): a pending
    approval past its deadline whose policy says ``escalate`` goes, once, to ``escalate_to`` with
    a fresh deadline; any other expires with reason ``timed_out``, its gated action becomes
    rejected (an agent polling it sees the rejection and start() refuses) or its gated
    compensation step fails without running (its unwind goes on). Each in its own transaction,
    audited and announced. Returns how many expired."""
    now = now or timezone.now()
    expired = 0
    for approval_id in approval_deadlines.approvals_past_deadline(now=now):
        with transaction.atomic():
            escalated = approval_deadlines.approval_escalate(approval_id=approval_id, now=now)
            if escalated is not None:
                why = f"nobody decided before the deadline; escalated to {escalated.escalate_to}"
                _say("approvals.escalated", escalated, reason=why)
                continue
            approval = approvals.approval_expire(approval_id=approval_id, now=now)
            if approval is None:
                continue
            approval_settle(
                approval,
                actor=approval_deadlines.DEADLINE,
                reason=TIMED_OUT_REASON,
                data={"reason": approvals.TIMED_OUT, "escalated_to": approval.escalate_to or None}
                if approval.escalated_at
                else {"reason": approvals.TIMED_OUT},
            )
            approval.tenant = approval.run.tenant
            outbox.notify_approval_expired(approval)
            _say("approvals.expired", approval, reason=TIMED_OUT_REASON)
            expired += 1
    return expired


def _say(event: str, approval: Approval, *, reason: str) -> None:
    # One structured WARNING per escalation or expiry (docs/OPERATIONS.md, "What went wrong, in
    # the logs"), named like a compensation step's events: run, step (a gated step's), tool.
    log.warning(
        event,
        run_id=approval.run_id,
        approval_id=approval.pk,
        kind=approval.kind,
        step_id=approval.step_id or None,
        tool=approval.tool,
        attempt=None,
        reason=reason,
    )


# What the action or step records as why it was refused (its ``error``).
TIMED_OUT_REASON = "timed_out: nobody decided before the approval deadline"


def agents_detect_lost(*, now: datetime | None = None) -> int:
    """Runs still ``running`` with no heartbeat for SAGA HEARTBEAT_TIMEOUT_S, and no approval of
    theirs open or decided within it: the agent is gone.
    Each fails into the recovery queue as ``agent_lost`` (in its own transaction). A resumed run
    counts its silence from the resume; one whose resume the agent never picked up is not
    compensated automatically (``run_fail_and_queue``): its item says so and waits for a person."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=saga().heartbeat_timeout_s)
    resumed_since = Exists(
        AgentCommand.objects.filter(
            run_id=OuterRef("pk"), kind=AgentCommand.Kind.RESUME, created_at__gte=cutoff
        )
    )
    # An agent waiting for a person is not lost: its run is quiet while an approval of one of its
    # actions is open (or closed, decided or expired, within the timeout: the silence counts
    # from then). A framework's human-in-the-loop pause sends no heartbeats.
    waiting_for_a_person = Exists(
        Approval.objects.filter(run_id=OuterRef("pk"), kind=Approval.Kind.ACTION).filter(
            Q(status=Approval.Status.PENDING, expires_at__gte=cutoff) | Q(decided_at__gte=cutoff)
        )
    )
    lost = (
        (Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True, created_at__lt=cutoff))
        & ~Q(resumed_since)
        & ~Q(waiting_for_a_person)
    )
    failed = 0
    for run_id in Run.objects.filter(lost, status=Run.Status.RUNNING).values_list("pk", flat=True):
        with transaction.atomic():
            run = (
                Run.objects.select_for_update(skip_locked=True)
                .filter(lost, pk=run_id, status=Run.Status.RUNNING)
                .first()
            )
            if run is None:
                continue  # it heart-beat meanwhile, or another sweeper has it
            resumed_at = (
                AgentCommand.objects.filter(run_id=run.pk, kind=AgentCommand.Kind.RESUME)
                .order_by("-created_at")
                .values_list("created_at", flat=True)
                .first()
            )
            heard_at = run.last_heartbeat_at or run.created_at
            since = f"{int((now - heard_at).total_seconds())}s"
            if resumed_at is not None and resumed_at > heard_at:
                since += f", {int((now - resumed_at).total_seconds())}s since the resume"
            run_fail_and_queue(
                run=run,
                actor=Actor.system("heartbeat-monitor"),
                reason="agent_lost",
                # No agent is left to decide what an approval it waited for was for.
                withdraw_approvals=True,
                error=f"No heartbeat for {since} (threshold "
                f"{saga().heartbeat_timeout_s}s): the agent is presumed lost.",
            )
            failed += 1
    return failed
