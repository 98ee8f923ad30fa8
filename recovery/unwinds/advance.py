"""Advancing an unwind, under its row lock: its next move (nothing while a step is in flight,
finish, ask for an approval, or put the next step in flight: queued for a job, or claimed for
the worker that advanced it), and the move an approval's decision makes on its step.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Case, When
from django.utils import timezone

from infra import errors
from ledger.audit import Actor
from ledger.policies.deadlines import ApprovalDeadline
from recovery.models import Approval, Unwind, UnwindStep
from recovery.transitions import approvals
from recovery.unwinds.claim import Claim, step_start
from recovery.unwinds.dispatch import enqueue_advance, enqueue_step, step_timeout_of
from recovery.unwinds.finish import unwind_finish
from recovery.unwinds.state import (
    ENGINE,
    IN_FLIGHT,
    PROBLEMS,
    all_steps,
    lock_unwind,
    planned_step,
    step_transition,
    unwind_pause_for_step,
    unwind_set_status,
)


def advance_locked(unwind: Unwind, *, claim: bool) -> Claim | None:
    """The unwind's next move, under its row lock: nothing (a step is in flight, or the unwind is
    not running), finish, ask for approval, or put the next step in flight. With ``claim`` the
    next step is also claimed for the caller, who runs it; without, its job is enqueued.

    One query finds both what is in flight and what comes next (in-flight rows sort first), rather
    than loading every step with its action on every advance."""
    if unwind.status != Unwind.Status.RUNNING:
        return None
    while True:
        step = (
            unwind.steps.filter(status__in=(*IN_FLIGHT, UnwindStep.Status.PENDING))
            .select_related("action")
            .order_by(Case(When(status=UnwindStep.Status.PENDING, then=1), default=0), "position")
            .first()
        )
        if step is not None and step.status != UnwindStep.Status.PENDING:
            return None  # one step at a time; its own job (or the sweeper) moves it on
        if step is None or (
            unwind.on_failure == Unwind.OnFailure.HALT and unwind.steps.filter(status__in=PROBLEMS).exists()
        ):
            unwind_finish(unwind=unwind, steps=all_steps(unwind))
            return None
        step.unwind = unwind
        step.action.run = unwind.run
        args_error = planned_step(unwind, step).get("args_error")
        if not args_error:
            break
        # Nothing to run and nothing an approver could approve: the step fails, naming the path
        # its args lack, and the unwind goes on with the next one (or halts).
        step_transition(
            step,
            to=UnwindStep.Status.FAILED,
            allowed_from=(UnwindStep.Status.PENDING,),
            actor=ENGINE,
            kind="step.failed",
            reason=args_error,
            updates={"error": args_error, "finished_at": timezone.now()},
        )
    if step.requires_approval:
        approval = Approval.objects.filter(step=step).first()
        if approval is None or approval.status != Approval.Status.APPROVED:
            _step_request_approval(unwind=unwind, step=step, approval=approval)
            return None
    if not claim:
        _step_queue(unwind=unwind, step=step, actor=ENGINE, kind="step.queued")
        return None
    # Claimed straight from pending: the step never waits for a worker, so there is no "queued"
    # state to record; its "step.started" event says pending → running.
    return step_start(step, allowed_from=(UnwindStep.Status.PENDING,))


@transaction.atomic
def unwind_advance_move(*, unwind_id: str) -> Unwind | None:
    """Move the unwind one step forward: the next step is queued and its job enqueued. Safe to
    call any number of times, from any process."""
    unwind = lock_unwind(unwind_id)
    if unwind is not None:
        advance_locked(unwind, claim=False)
    return unwind


@transaction.atomic
def unwind_advance_and_claim(*, unwind_id: str) -> Claim | None:
    """As ``unwind_advance_move``, but the next step is claimed for the caller (a worker that runs it
    now) instead of being handed to a job of its own."""
    unwind = lock_unwind(unwind_id)
    return advance_locked(unwind, claim=True) if unwind is not None else None


def _step_queue(
    *,
    unwind: Unwind,
    step: UnwindStep,
    actor: Actor,
    kind: str,
    reason: str = "",
    allowed_from: tuple[str, ...] = (UnwindStep.Status.PENDING,),
    updates: dict[str, Any] | None = None,
) -> None:
    now = timezone.now()
    try:
        step_transition(
            step,
            to=UnwindStep.Status.QUEUED,
            allowed_from=allowed_from,
            actor=actor,
            kind=kind,
            reason=reason,
            updates={"next_attempt_at": now, "job_id": "", **(updates or {})},
        )
    except errors.InvalidTransition:
        return  # another process moved the step first: its own job (or the sweeper) carries it on
    enqueue_step(step.pk, step_timeout_s=step_timeout_of(unwind))


def _planned_risk(unwind: Unwind, step: UnwindStep) -> str:
    return str(planned_step(unwind, step).get("risk") or step.action.risk)


def _step_request_approval(*, unwind: Unwind, step: UnwindStep, approval: Approval | None) -> None:
    if approval is not None and approval.status != Approval.Status.PENDING:
        # OneToOne: a step gets one approval. A refused one was already turned into a failed
        # step; reaching here would mean a retry slipped past step_retry's check.
        raise errors.Conflict(
            f"Step {step.pk}'s approval was {approval.status}; start a new compensation.",
            details={"step_id": step.pk, "approval_id": approval.pk},
            code="approval_not_granted",
        )
    step_transition(
        step,
        to=UnwindStep.Status.AWAITING_APPROVAL,
        allowed_from=(UnwindStep.Status.PENDING,),
        actor=ENGINE,
        kind="step.awaiting_approval",
    )
    unwind_pause_for_step(unwind, step)
    if approval is None:
        approvals.approval_request(
            run=unwind.run,
            action=step.action,
            step=step,
            tool=step.tool,
            args=step.args,
            risk=_planned_risk(unwind, step),
            actor=ENGINE,
            requested_by=unwind.requested_by,
            requested_by_key=unwind.requested_by_key,
            # The deadline of the compensating tool's policy, the one that asked for a person
            # (``recovery.planner``: frozen in the plan with the step).
            deadline=ApprovalDeadline.of(planned_step(unwind, step).get("policy")),
        )


@transaction.atomic
def step_approval_decided(*, approval: Approval, actor: Actor) -> UnwindStep:
    """The approval of a compensation step was approved, rejected or expired (the approval row is
    already decided, in this transaction). Approved: the step runs with the approved args.
    Rejected or expired: the step fails without running, and the unwind goes on (or halts)."""
    step = UnwindStep.objects.select_related("action").get(pk=approval.step_id)
    unwind = lock_unwind(step.unwind_id)
    assert unwind is not None
    step.unwind = unwind
    if step.status != UnwindStep.Status.AWAITING_APPROVAL:
        raise errors.InvalidTransition(
            step,
            to="queued",
            current=step.status,
            message=f"Step {step.pk} is {step.status}; it is not waiting for approval.",
        )
    unwind_set_status(
        unwind,
        to=Unwind.Status.RUNNING,
        allowed_from=(Unwind.Status.PAUSED,),
        actor=actor,
        kind="unwind.resumed",
        data={"approval_id": approval.pk, "decision": approval.status},
    )
    if approval.status == Approval.Status.APPROVED:
        edited = approval.approved_args_hash and approval.approved_args_hash != approval.args_hash
        _step_queue(
            unwind=unwind,
            step=step,
            actor=actor,
            kind="step.approved",
            reason=approval.reason,
            allowed_from=(UnwindStep.Status.AWAITING_APPROVAL,),
            updates={"args": approval.approved_args} if edited else None,
        )
        return step
    verdict = "expired without a decision" if approval.status == Approval.Status.EXPIRED else "was rejected"
    step_transition(
        step,
        to=UnwindStep.Status.FAILED,
        allowed_from=(UnwindStep.Status.AWAITING_APPROVAL,),
        actor=actor,
        kind=f"step.approval_{approval.status}",
        reason=approval.reason,
        updates={
            "error": f"Approval {approval.pk} {verdict}: {approval.reason}".strip(),
            "finished_at": timezone.now(),
        },
    )
    # The step never ran, so the action keeps its status (succeeded): nothing was undone.
    enqueue_advance(unwind.pk)
    return step
