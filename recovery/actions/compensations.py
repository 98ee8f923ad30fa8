"""Compensating a run: ``unwind_start`` (an operator, or the policy's auto-compensation when the
run qualifies), and the operator's moves on an unwind under way, each with its refusal audited
(retry or skip a step, stop the unwind; the engine's ``recovery.unwinds.moves`` does them).
"""

from __future__ import annotations

from django.db import transaction

from infra import errors
from ledger.audit import Actor
from ledger.models import RISK_ORDER, Action, Risk, Run
from ledger.policies.resolve import policy_settings_for
from ledger.rules import reason_required
from ledger.services import runs
from recovery.actions import commands
from recovery.actions.refusals import audits_refusals, refuse_unknown_outcomes
from recovery.models import RecoveryItem, Unwind, UnwindStep
from recovery.planner import compensation_plan
from recovery.transitions import items
from recovery.unwinds import create, moves

AUTO_COMPENSATOR = Actor.system("auto-compensate")


def _refuse_running_actions(run: Run, *, doing: str) -> None:
    """An action still ``running`` on a run that is no longer running: its agent may yet report
    how it ended, and if it happened it is the first thing an unwind must undo (newest first). So
    it is treated like an unknown outcome; cancelling the run turns it into one, to reconcile
    (``ledger.services.runs.run_cancel``). Nothing stays ``running`` under an unwind."""
    running = list(
        Action.objects.filter(run_id=run.pk, status=Action.Status.RUNNING)
        .order_by("seq")
        .values_list("pk", "tool", "seq")
    )
    if not running:
        return
    named = ", ".join(f"{tool} (#{seq})" for _, tool, seq in running)
    way_out = (
        " or cancel the run: its running actions then get an unknown outcome, which you reconcile"
        if run.status in runs.CANCELLABLE
        else ""
    )
    raise errors.Conflict(
        f"Cannot {doing}: {named} {'is' if len(running) == 1 else 'are'} still running, so whether "
        f"it happened is not known yet. Wait for the agent to report it,{way_out}.",
        details={"unknown_action_ids": [pk for pk, _, _ in running], "running": True},
        code="outcome_unknown",
    )


@audits_refusals("compensate")
@transaction.atomic
def unwind_start(
    *,
    item: RecoveryItem,
    actor: Actor,
    reason: str,
    automatic: bool = False,
    action_ids: list[str] | None = None,
    to_checkpoint: str | None = None,
    plan_hash: str | None = None,
) -> Unwind:
    """Compensate the item's run: claim the item, move the run to compensating, freeze the plan
    into persisted steps and, after commit, hand the first step to a worker. Two concurrent calls
    produce one unwind; the loser gets InvalidTransition with the item's current state.

    ``action_ids`` or ``to_checkpoint``: undo only that part of the plan (``recovery.planner``;
    a bad choice is a 422 naming it); the plan's other undoable actions are kept, and the frozen
    plan records them. ``plan_hash``: the plan the operator read; a different plan now is 409
    ``plan_changed`` (``details.plan_hash``: the plan's hash now) and nothing starts."""
    reason = reason_required(reason)
    item = RecoveryItem.objects.select_related("run__tenant").get(pk=item.pk)
    items.item_claim(item=item, actor=actor, reason=reason)
    run = Run.objects.select_for_update().select_related("tenant").get(pk=item.run_id)
    if run.status == Run.Status.RUNNING:
        raise errors.InvalidTransition(
            run,
            to=Run.Status.COMPENSATING,
            current=run.status,
            message=f"Run {run.pk} is still running: cancel it first, so its agent stops, then compensate.",
        )
    plan = compensation_plan(run=run, action_ids=action_ids, to_checkpoint=to_checkpoint)
    refuse_unknown_outcomes(plan, doing="compensate")
    _refuse_running_actions(run, doing="compensate")
    if plan_hash is not None and plan_hash != plan.plan_hash:
        raise errors.PlanChanged(
            "The compensation plan changed since you read it (an action finished, or its arguments "
            "or policy changed). Nothing was started; review the new plan.",
            details={"plan_hash": plan.plan_hash, "shown_plan_hash": plan_hash, "run_id": run.pk},
        )
    runs.run_compensation_started(run=run, actor=actor, reason=reason)
    commands.commands_cancel_pending(run=run, actor=actor, reason="The run is being compensated.")
    return create.unwind_create(
        run=run, item=item, plan=plan, actor=actor, reason=reason, automatic=automatic
    )


def auto_compensate(*, run: Run, item: RecoveryItem) -> Unwind | None:
    """Unwind without a human when the run qualifies (``auto_compensable``). A step whose policy
    still wants an approver waits for one even then."""
    max_allowed = auto_compensable(run)
    if max_allowed is None:
        return None
    return unwind_start(
        item=item,
        actor=AUTO_COMPENSATOR,
        automatic=True,
        reason=f"auto-compensation: every action and compensating tool is at or under {max_allowed} risk",
    )


def auto_compensable(run: Run) -> str | None:
    """The policy's ``auto_compensate.max_risk`` when every live action, and every compensating
    tool that would undo one (by its own policy, the default one when it has none), is at or under
    it, there is something to undo (and nothing unknown) and every step's compensator reaches the
    upstream its action was performed on; otherwise None."""
    max_allowed = policy_settings_for(run.tenant).auto_compensate_max_risk
    if max_allowed is None:
        return None
    threshold = RISK_ORDER[Risk(max_allowed)]
    live = list(Action.objects.filter(run=run, status__in=items.LIVE_ACTION_STATUSES))
    # An action still running may yet be reported (the run is failed, not cancelled): a person
    # waits for it or cancels the run, as with an unknown outcome (unwind_start refuses it too).
    if not live or any(a.status in (Action.Status.UNKNOWN, Action.Status.RUNNING) for a in live):
        return None
    if any(RISK_ORDER[Risk(a.risk)] > threshold for a in live):
        return None
    undoable = [step for step in compensation_plan(run=run).steps if step.can_undo]
    if not undoable:
        return None
    if any(step.policy and RISK_ORDER[Risk(step.policy["risk"])] > threshold for step in undoable):
        return None
    # A step whose compensator does not reach the upstream that performed its action is a
    # person's to decide: the whole run waits in the queue, its plan showing the mismatch.
    if any(step.upstream_mismatch for step in undoable):
        return None
    return str(max_allowed)


# --- The operator's moves on an unwind under way ------------------------------------------


@audits_refusals("retry_step")
def step_retry(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    return moves.step_retry(step=step, actor=actor, reason=reason)


@audits_refusals("skip_step")
def step_skip(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    return moves.step_skip(step=step, actor=actor, reason=reason)


@audits_refusals("stop_unwind")
def unwind_stop(*, unwind: Unwind, actor: Actor, reason: str) -> Unwind:
    """Stop a running unwind between steps; its item goes back to the queue
    (``recovery.unwinds.moves.unwind_stop``)."""
    return moves.unwind_stop(unwind=unwind, actor=actor, reason=reason)
