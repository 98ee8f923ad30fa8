"""The compensation plan of a run: what an unwind would do, shown before anything runs (dry run)
and frozen into the unwind when the operator confirms.

Steps are the run's succeeded (or previously failed-to-compensate) actions, newest completion
first (LIFO by ``Action.completion_seq``). Read-only actions changed nothing and are left out.

A step needs approval when the compensating tool's own policy says ``manual`` (an explicit
policy; the conservative built-in default for unknown tools is not applied to compensations, or
every undo would wait for a human) or when the forward action's risk is ``high`` or above:
undoing a risky action is itself risky. The approval's risk is the higher of the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.models import Action, ActionClass, ApprovalMode, CompensationStrategy, Risk, Run, max_risk
from ledger.policies import policy_resolve
from ledger.selectors import run_warnings
from recovery import compensators

# Actions whose effect may still be in the world and that an unwind therefore undoes.
PLANNABLE_STATUSES = (Action.Status.SUCCEEDED, Action.Status.COMPENSATION_FAILED)
APPROVAL_RISKS = (Risk.HIGH, Risk.CRITICAL)


@dataclass
class PlanStep:
    action: Action
    tool: str
    args: Any
    strategy: str
    requires_approval: bool
    can_undo: bool
    risk: str
    compensator: str = ""  # webhook | python | "" (none registered)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "action_id": self.action.pk,
            "action_tool": self.action.tool,
            "action_seq": self.action.seq,
            "completion_seq": self.action.completion_seq,
            "action_class": self.action.action_class,
            "target_type": self.action.target_type,
            "target_id": self.action.target_id,
            "tool": self.tool,
            "args": self.args,
            "strategy": self.strategy,
            "requires_approval": self.requires_approval,
            "can_undo": self.can_undo,
            "risk": self.risk,
            "compensator": self.compensator,
            "note": self.note,
        }


@dataclass
class Plan:
    run: Run
    steps: list[PlanStep] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def unknown_actions(self) -> list[str]:
        return [w["action_id"] for w in self.warnings if w.get("code") == "outcome_unknown"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run.pk,
            "steps": [step.as_dict() for step in self.steps],
            "warnings": self.warnings,
            "needs_approval": sum(1 for s in self.steps if s.requires_approval),
            "cannot_undo": sum(1 for s in self.steps if not s.can_undo),
        }


def _step_for(action: Action) -> PlanStep:
    strategy = action.compensation_strategy
    tool = action.compensation_tool
    args: Any = action.compensation_args
    note = ""
    can_undo = True
    if strategy == CompensationStrategy.SNAPSHOT:
        args = action.before_snapshot
        if action.before_snapshot is None:
            can_undo, note = False, "cannot be undone: no before snapshot was recorded to restore"
        elif action.after_snapshot is None:
            note = "no after snapshot recorded: drift can only be checked by the compensator itself"
    elif strategy == CompensationStrategy.NONE or not tool:
        can_undo = False
        note = "cannot be undone"
        if action.action_class == ActionClass.EXTERNAL_IRREVERSIBLE:
            note = "cannot be undone: irreversible and no correction is registered"
    elif strategy == CompensationStrategy.CORRECTION:
        note = "irreversible: a correction is issued, the original effect stays visible"

    risk = action.risk
    requires_approval = False
    if can_undo:
        comp_policy = policy_resolve(tenant=action.run.tenant, tool=tool)
        explicit = comp_policy.scope != "default"
        if explicit:
            risk = max_risk(action.risk, comp_policy.risk)
            requires_approval = comp_policy.approval == ApprovalMode.MANUAL
        requires_approval = requires_approval or action.risk in APPROVAL_RISKS
    served_by = compensators.compensator_describe(tenant_id=action.tenant_id, tool=tool) if can_undo else ""
    if can_undo and not served_by:
        note = (note + "; " if note else "") + f"no compensator is registered for {tool}: the step will fail"
    return PlanStep(
        action=action,
        tool=tool,
        args=args,
        strategy=strategy,
        requires_approval=requires_approval,
        can_undo=can_undo,
        risk=risk,
        compensator=served_by,
        note=note,
    )


def compensation_plan(*, run: Run) -> Plan:
    """The dry run. Pure read: safe to call from a page render or an API GET."""
    actions = list(run.actions.select_related("run__tenant").order_by("seq"))
    plannable = [
        a for a in actions if a.status in PLANNABLE_STATUSES and a.action_class != ActionClass.READ_ONLY
    ]
    # LIFO: newest completion first. completion_seq is set under the run's row lock, so it is a
    # total order even when two actions finished in the same millisecond.
    plannable.sort(key=lambda a: a.completion_seq or 0, reverse=True)
    plan = Plan(
        run=run, steps=[_step_for(a) for a in plannable], warnings=run_warnings(run=run, actions=actions)
    )
    for step in plan.steps:
        if not step.can_undo:
            plan.warnings.append(
                {
                    "code": "cannot_undo",
                    "action_id": step.action.pk,
                    "message": f"{step.action.tool} (#{step.action.seq}) {step.note}.",
                }
            )
    return plan
