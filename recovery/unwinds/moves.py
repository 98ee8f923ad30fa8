"""The operator's moves on an unwind under way or finished with failures: retry or skip a failed
step, stop the unwind between steps, ask again for a step's approval.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from infra import errors
from ledger.audit import Actor
from ledger.models import Run
from ledger.rules import reason_required
from ledger.services import runs
from ledger.services.actions import moves as action_moves
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from recovery.transitions import approvals, items
from recovery.unwinds.dispatch import enqueue_advance
from recovery.unwinds.finish import stop_report
from recovery.unwinds.state import (
    IN_FLIGHT,
    PROBLEMS,
    STOPPABLE,
    all_steps,
    lock_unwind,
    step_transition,
    unwind_pause_for_step,
    unwind_set_status,
)

# --- Operator decisions on a step ------------------------------------------------------------


def _unwind_reactivate(*, unwind: Unwind, actor: Actor, reason: str) -> None:
    """A finished-with-failures unwind picks up again after an operator's retry or skip: the run
    goes back to compensating and the reopened item is claimed again."""
    if unwind.status in (Unwind.Status.RUNNING, Unwind.Status.PAUSED):
        return
    if unwind.status != Unwind.Status.FAILED:
        raise errors.InvalidTransition(unwind, to=Unwind.Status.RUNNING, current=unwind.status)
    run = Run.objects.select_for_update().select_related("tenant").get(pk=unwind.run_id)
    runs.run_compensation_started(run=run, actor=actor, reason=reason)
    unwind_set_status(
        unwind,
        to=Unwind.Status.RUNNING,
        allowed_from=(Unwind.Status.FAILED,),
        actor=actor,
        kind="unwind.reactivated",
        reason=reason,
    )
    item = RecoveryItem.objects.filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
    if item is not None:
        item.run = run
        items.item_claim(item=item, actor=actor, reason=reason)
        if unwind.item_id != item.pk:
            Unwind.objects.filter(pk=unwind.pk).update(item=item)
            unwind.item = item


def _lock_step_for_decision(step: UnwindStep) -> tuple[Unwind, UnwindStep]:
    current = UnwindStep.objects.select_related("action").get(pk=step.pk)
    unwind = lock_unwind(current.unwind_id)
    assert unwind is not None
    current = UnwindStep.objects.select_for_update(of=("self",)).select_related("action").get(pk=step.pk)
    current.unwind = unwind
    return unwind, current


@transaction.atomic
def step_retry(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    """A failed or drifted step runs again (an operator's "retry anyway": for a drifted snapshot
    restore the reader's drift check is skipped this time). The unwind continues after it."""
    reason = reason_required(reason)
    unwind, current = _lock_step_for_decision(step)
    if current.status not in PROBLEMS:
        raise errors.InvalidTransition(current, to=UnwindStep.Status.PENDING, current=current.status)
    approval = Approval.objects.filter(step=current).first()
    if approval is not None and approval.status in (Approval.Status.REJECTED, Approval.Status.EXPIRED):
        raise errors.Conflict(
            f"Step {current.pk}'s approval {approval.status}: retrying would run it unapproved. Ask for "
            f"the approval again instead (request-again on approval {approval.pk}).",
            details={"step_id": current.pk, "approval_id": approval.pk, "current": approval.status},
            code="approval_not_granted",
        )
    override = current.status == UnwindStep.Status.DRIFTED
    _unwind_reactivate(unwind=unwind, actor=actor, reason=reason)
    step_transition(
        current,
        to=UnwindStep.Status.PENDING,
        allowed_from=PROBLEMS,
        actor=actor,
        kind="step.retry_requested",
        reason=reason,
        updates={
            "attempts": 0,
            "next_attempt_at": None,
            "finished_at": None,
            "job_id": "",
            "result": {"override_drift": True} if override else None,
        },
        data={"override_drift": override, "previous_error": current.error},
    )
    enqueue_advance(unwind.pk)
    return current


@transaction.atomic
def step_skip(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    """The operator leaves a failed or drifted step undone; the unwind continues. The action keeps
    ``compensation_failed``: its effect is still in the world, and the trail says so."""
    reason = reason_required(reason)
    unwind, current = _lock_step_for_decision(step)
    if current.status not in PROBLEMS:
        raise errors.InvalidTransition(current, to=UnwindStep.Status.SKIPPED, current=current.status)
    _unwind_reactivate(unwind=unwind, actor=actor, reason=reason)
    step_transition(
        current,
        to=UnwindStep.Status.SKIPPED,
        allowed_from=PROBLEMS,
        actor=actor,
        kind="step.skipped",
        reason=reason,
        updates={"finished_at": timezone.now()},
        data={"previous_error": current.error},
    )
    enqueue_advance(unwind.pk)
    return current


# --- Stopping an unwind ----------------------------------------------------------------------


def _step_stopped(step: UnwindStep, *, actor: Actor, reason: str) -> None:
    """A step in flight when its unwind stops (the caller holds the unwind's and the step's rows):
    one waiting for its approval or its first attempt goes back to pending (never started, its
    action still stands; a pending approval is withdrawn); one waiting to be retried fails (an
    earlier attempt may have acted: the action is compensation_failed, for a person to check); a
    running one is left to finish (its outcome is recorded, and nothing starts after it)."""
    note = f"the unwind was stopped: {reason}"
    if step.status == UnwindStep.Status.AWAITING_APPROVAL:
        approval = Approval.objects.filter(step=step, status=Approval.Status.PENDING).first()
        if approval is not None:
            approvals.approval_withdraw(approval=approval, actor=actor, reason=note)
    if step.status == UnwindStep.Status.AWAITING_APPROVAL or (
        step.status == UnwindStep.Status.QUEUED and not step.attempts
    ):
        step_transition(
            step,
            to=UnwindStep.Status.PENDING,
            allowed_from=(step.status,),
            actor=actor,
            kind="step.stopped",
            reason=reason,
            updates={"next_attempt_at": None, "job_id": ""},
        )
    elif step.status == UnwindStep.Status.QUEUED:
        error = f"Not retried: the unwind was stopped. Attempt {step.attempts} failed: {step.error}"
        step_transition(
            step,
            to=UnwindStep.Status.FAILED,
            allowed_from=(UnwindStep.Status.QUEUED,),
            actor=actor,
            kind="step.stopped",
            reason=reason,
            updates={"error": error, "next_attempt_at": None, "job_id": "", "finished_at": timezone.now()},
        )
        action_moves.action_compensation_finished(
            action=step.action, actor=actor, outcome="failed", step_id=step.pk, reason=error
        )


@transaction.atomic
def unwind_stop(*, unwind: Unwind, actor: Actor, reason: str) -> Unwind:
    """Stop a running (or paused) unwind between steps: no step starts after this commits; a step
    whose compensator call is in flight finishes and its outcome is recorded. The unwind becomes
    ``cancelled`` ("Stopped"), the run leaves ``compensating`` (back to ``failed``), and the
    recovery item goes back to the queue (open), naming what was undone and what was not, so a
    person decides again (compensate what is left, resume or close). A finished unwind → 409."""
    reason = reason_required(reason)
    locked = lock_unwind(unwind.pk)
    if locked is None:
        raise errors.NotFound.for_id("Unwind", unwind.pk)
    if locked.status not in STOPPABLE:
        raise errors.InvalidTransition(
            locked,
            to=Unwind.Status.CANCELLED,
            current=locked.status,
            message=f"Unwind {locked.pk} is {locked.status}; only a running or paused unwind can be stopped.",
        )
    in_flight = list(
        UnwindStep.objects.select_for_update(of=("self",))
        .select_related("action")
        .filter(unwind=locked, status__in=IN_FLIGHT)
        .order_by("position")
    )
    for step in in_flight:
        step.unwind = locked
        step.action.run = locked.run
        _step_stopped(step, actor=actor, reason=reason)
    steps = all_steps(locked)
    summary, details = stop_report(steps, by=actor.label, reason=reason, at=timezone.now().isoformat())
    unwind_set_status(
        locked,
        to=Unwind.Status.CANCELLED,
        allowed_from=STOPPABLE,
        actor=actor,
        kind="unwind.stopped",
        reason=reason,
        data=details,
    )
    run = Run.objects.select_for_update().select_related("tenant").get(pk=locked.run_id)
    runs.run_compensation_finished(run=run, actor=actor, complete=False, reason=summary)
    item = RecoveryItem.objects.filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
    items.item_reopen_after_unwind(
        unwind=locked,
        run=run,
        reason=item.reason if item is not None else RecoveryItem.Reason.MANUAL,
        error=summary,
        left=details["not_undone"] + details["running"],
        details={"stopped": details},
    )
    return locked


# --- Asking again for a step's approval --------------------------------------------------------


@transaction.atomic
def step_approval_ask_again(*, approval: Approval, actor: Actor, reason: str) -> Approval:
    """The step whose approval expired or was rejected (so it failed without running) waits for a
    new approval of the same tool and args, linked to the old one. Only once its unwind has
    finished its other steps (``failed``: it stopped with this step left): the unwind picks up
    again, paused on this step, and the run goes back to compensating. ``approval`` is locked
    and checked by ``approvals.approval_lock_for_asking_again``."""
    if approval.step_id is None:
        raise errors.InvalidTransition(
            approval,
            to=Approval.Status.PENDING,
            current=approval.status,
            message=f"Approval {approval.pk} no longer belongs to a step; it was asked again already.",
        )
    unwind, step = _lock_step_for_decision(UnwindStep(pk=approval.step_id))
    step.action.run = unwind.run
    if step.status != UnwindStep.Status.FAILED:
        raise errors.InvalidTransition(
            step,
            to=UnwindStep.Status.AWAITING_APPROVAL,
            current=step.status,
            message=f"Step {step.pk} is {step.status}; only a step that failed for want of approval can ask again.",
        )
    if unwind.status != Unwind.Status.FAILED:
        why = (
            "was stopped; start a new compensation to undo what is left"
            if unwind.status == Unwind.Status.CANCELLED
            else f"is still {unwind.status}; ask again once it has finished its other steps"
        )
        raise errors.InvalidTransition(
            unwind, to=Unwind.Status.RUNNING, current=unwind.status, message=f"Unwind {unwind.pk} {why}."
        )
    _unwind_reactivate(unwind=unwind, actor=actor, reason=reason)
    step_transition(
        step,
        to=UnwindStep.Status.AWAITING_APPROVAL,
        allowed_from=(UnwindStep.Status.FAILED,),
        actor=actor,
        kind="step.approval_requested_again",
        reason=reason,
        updates={"error": "", "finished_at": None},
        data={"previous_approval_id": approval.pk, "previous_error": step.error},
    )
    unwind_pause_for_step(unwind, step)
    return approvals.approval_ask_again(previous=approval, actor=actor, reason=reason, step=step)
