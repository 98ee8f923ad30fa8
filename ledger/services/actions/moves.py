"""An action's state moves after it is recorded: approval (awaiting, approved, rejected, asked
again), the start, the agent's reports (succeeded, failed, unknown), reconciling an unknown
outcome, the agent's check of the effect, and compensation. One function per move, keyword-only
and typed; each is a compare-and-set (``ledger.transitions``, or one call of
``saga_action_move``) with its audit event in the same transaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from infra import errors, metrics
from ledger.audit import Actor, audit_record, event_template, slot
from ledger.models import Action, Run
from ledger.rules import reason_required
from ledger.services import pauses, writes
from ledger.services.runs import run_assert_accepts_writes, run_closed_states, run_lock
from ledger.transitions import ACTION_TRANSITIONS, transition


def _fill(action: Action, row: Action) -> None:
    """``action`` (maybe a reference) as ``row``, read under the write's locks."""
    for name in _ALL_FIELDS:
        setattr(action, name, getattr(row, name))
    action._state.adding = False
    # The run the instance may carry was read before this write moved its chain head and
    # counters: the next access reads it again.
    action._state.fields_cache.pop("run", None)


_ALL_FIELDS = [f.attname for f in Action._meta.concrete_fields]


def _action_transition(action: Action, **fields: Any) -> Action:
    """``ledger.transitions.transition`` on the action table, on its run's audit chain."""
    moved = transition(action, table=ACTION_TRANSITIONS, run=action.run, **fields)
    metrics.ledger_moved()
    return moved


@transaction.atomic
def action_await_approval(*, action: Action, actor: Actor) -> Action:
    return _action_transition(
        action,
        to=Action.Status.AWAITING_APPROVAL,
        actor=actor,
        kind="action.awaiting_approval",
        allowed_from=[Action.Status.PLANNED],
    )


@transaction.atomic
def action_await_approval_again(*, action: Action, actor: Actor, reason: str) -> Action:
    """rejected → awaiting_approval: its approval expired or was rejected and is asked again. Only
    while the run still takes writes (the agent is waiting for it); the caller opens the approval."""
    action.run = run = run_lock(action.run)  # fresh, with its audit chain head
    run_assert_accepts_writes(run)
    return _action_transition(
        action,
        to=Action.Status.AWAITING_APPROVAL,
        actor=actor,
        kind="action.awaiting_approval",
        reason=reason,
        updates={"error": ""},
        allowed_from=[Action.Status.REJECTED],
        data={"asked_again": True},
    )


@transaction.atomic
def action_approve(*, action: Action, actor: Actor, reason: str, args: Any = None) -> Action:
    """awaiting_approval → approved; ``args`` replaces the action's args when the approver edited
    them (the approval service has already audited both versions)."""
    updates: dict[str, Any] = {}
    if args is not None:
        updates["args"] = args
    return _action_transition(
        action,
        to=Action.Status.APPROVED,
        actor=actor,
        kind="action.approved",
        reason=reason,
        updates=updates,
    )


@transaction.atomic
def action_reject(*, action: Action, actor: Actor, reason: str) -> Action:
    return _action_transition(
        action,
        to=Action.Status.REJECTED,
        actor=actor,
        kind="action.rejected",
        reason=reason,
        updates={"error": reason},
    )


def action_start(*, action: Action, actor: Actor) -> Action:
    """planned/approved/failed → running, attempts + 1. Gated actions explain why they may not.

    One call of ``saga_action_move``; with a pause active in the tenant, the pause is checked in
    Python under the run's lock first (a pause of this tool or agent stops the call even though it
    was recorded before the pause). ``action`` may be a reference (``Action(pk, tenant, owner)``,
    ``ledger.selectors.action_reference_for_write``): it is filled in from the row."""
    move = _Move(
        to=Action.Status.RUNNING,
        kind="action.started",
        allowed=[Action.Status.APPROVED, Action.Status.FAILED],
        allowed_unless_approval=[Action.Status.PLANNED],
        report=False,
        counter="attempts",
        set={"started_at": timezone.now(), "error": "", "error_layer": ""},
        data={"attempt": slot("attempt")},
        pause_check=True,
    )
    return _action_move(action, actor=actor, move=move, refused=_start_refusal)


def _start_refusal(action: Action, current: str) -> errors.SagaError:
    if current == Action.Status.AWAITING_APPROVAL:
        return errors.ApprovalPending(
            f"Action {action.pk} is waiting for approval.",
            details={"action_id": action.pk, "current": current},
        )
    if current == Action.Status.REJECTED:
        return errors.ApprovalRejected(
            f"Action {action.pk} was rejected (or its approval expired).",
            details={"action_id": action.pk, "current": current, "error": action.error},
        )
    if current == Action.Status.PLANNED and action.requires_approval:
        return errors.ApprovalPending(
            f"Action {action.pk} needs approval before it starts.",
            details={"action_id": action.pk, "current": current},
        )
    return errors.InvalidTransition(action, to=Action.Status.RUNNING, current=current)


@dataclass(frozen=True)
class _Move:
    """An agent's report on its action, for ``saga_action_move``."""

    to: str
    kind: str
    allowed: list[str]
    report: bool  # the agent reporting how a running action ended (run_closed_states)
    set: dict[str, Any]
    data: dict[str, Any]
    allowed_unless_approval: list[str] = field(default_factory=list)
    counter: str | None = None
    reason: str = ""
    pause_check: bool = False


def _action_move(
    action: Action,
    *,
    actor: Actor,
    move: _Move,
    refused: Callable[[Action, str], errors.SagaError] | None = None,
) -> Action:
    payload = {
        "tenant_id": action.tenant_id,
        "run_owner": action.owner or "",
        "action_id": action.pk,
        "to": move.to,
        "allowed": move.allowed,
        "allowed_unless_approval": move.allowed_unless_approval,
        "closed": list(run_closed_states(report=move.report)),
        "counter": move.counter,
        "set": {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in {**move.set, "updated_at": timezone.now()}.items()
        },
        "pause_check": move.pause_check,
        "event": event_template(
            tenant_id=action.tenant_id,
            run_id=None,  # the action's, as the database reads it
            actor=actor,
            kind=move.kind,
            subject_type="action",
            subject_id=action.pk,
            from_state=slot("from"),
            to_state=move.to,
            reason=move.reason,
            data=move.data,
        ),
    }
    answer = writes.call("saga_action_move", payload)
    if answer["outcome"] == "checks":
        # A pause is active in the tenant: its patterns are Python's. Checked under the run's lock,
        # then the same call in the same transaction.
        with transaction.atomic():
            current = writes.action_from_row(answer["action"])
            run = run_lock(Run(pk=current.run_id, tenant_id=current.tenant_id), policy_stamp=True)
            pauses.pause_check_action(
                run=run, tool=current.tool, active=run.active_pauses, outcome="the action was not started"
            )
            answer = writes.call("saga_action_move", {**payload, "pause_check": False})
    outcome = answer["outcome"]
    if outcome == "not_found":
        raise errors.NotFound.for_id("Action", action.pk)
    row = writes.action_from_row(answer["action"])
    _fill(action, row)
    if outcome == "closed":
        run_assert_accepts_writes(Run(pk=row.run_id, status=answer["current"]), report=move.report)
    if outcome == "refused":
        current = answer["current"]
        raise (
            refused(action, current)
            if refused
            else errors.InvalidTransition(action, to=move.to, current=current)
        )
    if outcome != "moved":
        raise RuntimeError(f"saga_action_move answered {outcome!r}")
    return action


def action_succeed(
    *,
    action: Action,
    actor: Actor,
    result: Any = None,
    after_snapshot: Any = None,
    reconciled: bool = False,
    reason: str = "",
) -> Action:
    """running → succeeded (or unknown → succeeded when ``reconciled``); takes the next place in
    the run's completion order, which LIFO compensation follows.

    The agent's report is one call of ``saga_action_move``. A background job that finishes after
    the run was cancelled, closed or handed to an unwind cannot write (API.md); a failed run still
    takes the late report of an action that was running, and an operator reconciling an unknown
    outcome always may."""
    if reconciled:
        return _action_reconciled(
            action=action, actor=actor, result=result, after_snapshot=after_snapshot, reason=reason
        )
    updates: dict[str, Any] = {"completed_at": timezone.now(), "result": result}
    if after_snapshot is not None:
        updates["after_snapshot"] = after_snapshot
    move = _Move(
        to=Action.Status.SUCCEEDED,
        kind="action.succeeded",
        allowed=[Action.Status.RUNNING],
        report=True,
        counter="completion_seq",
        set=updates,
        data={"completion_seq": slot("completion_seq")},
        reason=reason,
    )
    return _action_move(action, actor=actor, move=move)


@transaction.atomic
def _action_reconciled(
    *, action: Action, actor: Actor, result: Any, after_snapshot: Any, reason: str
) -> Action:
    """unknown → succeeded: someone checked the target and it happened."""
    action.run = run = run_lock(action.run)  # fresh, with its audit chain head
    completion_seq = run.completion_count + 1
    updates: dict[str, Any] = {"completion_seq": completion_seq, "completed_at": timezone.now()}
    if result is not None:
        updates["result"] = result
    if after_snapshot is not None:
        updates["after_snapshot"] = after_snapshot
    _action_transition(
        action,
        to=Action.Status.SUCCEEDED,
        actor=actor,
        kind="action.reconciled",
        reason=reason,
        updates=updates,
        allowed_from=[Action.Status.UNKNOWN],
        data={"completion_seq": completion_seq},
        run_updates={"completion_count": completion_seq},
    )
    return action


def action_fail(
    *, action: Action, actor: Actor, error: str, retryable: bool, layer: str, outcome_unknown: bool = False
) -> Action:
    """running → failed, or → unknown when the call timed out and may have happened. One call of
    ``saga_action_move``; the late report of a running action: a failed run takes it
    (``run_assert_accepts_writes``)."""
    if layer not in Action.ErrorLayer.values:
        raise errors.ValidationFailed(
            f"layer must be one of {', '.join(Action.ErrorLayer.values)}.", details={"layer": layer}
        )
    move = _Move(
        to=Action.Status.UNKNOWN if outcome_unknown else Action.Status.FAILED,
        kind="action.outcome_unknown" if outcome_unknown else "action.failed",
        allowed=[Action.Status.RUNNING],
        report=True,
        set={"error": error, "retryable": retryable, "error_layer": layer, "completed_at": timezone.now()},
        data={"retryable": retryable, "layer": layer},
        reason=error,
    )
    return _action_move(action, actor=actor, move=move)


@transaction.atomic
def action_reconcile(
    *,
    action: Action,
    actor: Actor,
    happened: bool,
    reason: str,
    result: Any = None,
    after_snapshot: Any = None,
) -> Action:
    """unknown → succeeded (it did happen) or failed (it did not): someone checked the target."""
    reason = reason_required(reason)
    if happened:
        return _action_reconciled(
            action=action, actor=actor, result=result, after_snapshot=after_snapshot, reason=reason
        )
    return _action_transition(
        action,
        to=Action.Status.FAILED,
        actor=actor,
        kind="action.reconciled",
        reason=reason,
        allowed_from=[Action.Status.UNKNOWN],
        updates={"error": f"reconciled: did not happen ({reason})", "retryable": True},
    )


@transaction.atomic
def action_verify(
    *, action: Action, actor: Actor, ok: bool, expected: Any = None, actual: Any = None, reason: str = ""
) -> Action:
    """Record the agent's check of an action's effect. Not a status change; a mismatch is turned
    into a recovery item by the recovery service that calls this."""
    # The row's status, locked, not the caller's copy: a stale object must not verify an action
    # that has since been compensated.
    current = Action.objects.select_for_update().filter(pk=action.pk).values_list("status", flat=True).first()
    if current is None:
        raise errors.NotFound.for_id("Action", action.pk)
    if current not in (Action.Status.SUCCEEDED, Action.Status.UNKNOWN, Action.Status.RUNNING):
        raise errors.InvalidTransition(
            action,
            to="verified",
            current=current,
            message=f"Action {action.pk} is {current}; only a completed action can be verified.",
        )
    verification = {
        "ok": ok,
        "expected": expected,
        "actual": actual,
        "reason": reason,
        "at": timezone.now().isoformat(),
    }
    Action.objects.filter(pk=action.pk).update(
        verified=ok, verification=verification, updated_at=timezone.now()
    )
    action.verified, action.verification = ok, verification
    audit_record(
        tenant=action.run.tenant,
        run=action.run,
        actor=actor,
        kind="action.verified" if ok else "action.verification_failed",
        subject=action,
        reason=reason,
        data={"expected": expected, "actual": actual},
    )
    return action


@transaction.atomic
def action_compensation_started(*, action: Action, actor: Actor, step_id: str) -> Action:
    return _action_transition(
        action,
        to=Action.Status.COMPENSATING,
        actor=actor,
        kind="action.compensating",
        data={"step_id": step_id},
    )


@transaction.atomic
def action_compensation_finished(
    *, action: Action, actor: Actor, outcome: str, step_id: str, reason: str = "", state: Any = None
) -> Action:
    """compensating → compensated | compensation_failed, or back to succeeded when the step was
    skipped (the forward effect stands)."""
    targets = {
        "done": Action.Status.COMPENSATED,
        "failed": Action.Status.COMPENSATION_FAILED,
        "drifted": Action.Status.COMPENSATION_FAILED,
        "skipped": Action.Status.SUCCEEDED,
    }
    if outcome not in targets:
        raise errors.ValidationFailed(
            f"outcome must be one of {', '.join(targets)}.", details={"outcome": outcome}
        )
    # Only from compensating: "succeeded" is also reachable from running and unknown, and a
    # skipped step must not complete an action that never finished its forward call.
    return _action_transition(
        action,
        to=targets[outcome],
        actor=actor,
        kind=f"action.compensation_{outcome}",
        reason=reason,
        data={"step_id": step_id, "state": state},
        allowed_from=[Action.Status.COMPENSATING],
    )
