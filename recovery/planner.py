"""The compensation plan of a run: what an unwind would do, shown before anything runs (dry run)
and frozen into the unwind when the operator confirms.

Steps are the run's succeeded (or previously failed-to-compensate) actions, newest completion
first (LIFO by ``Action.completion_seq``). Read-only actions changed nothing and are left out.

Each step is governed by the *compensating* tool's own policy (the default policy when it has
none: an agent must not get an unattended undo by naming a tool nobody wrote a policy for). The
step runs unattended only when that policy's approval is ``auto`` and the forward action's risk
is under ``high`` (undoing a risky action is itself risky); otherwise it waits for an approver.
The step's risk is the higher of the two.

A compensation whose args the policy templates (``ledger.policies.compensation_args_fill``) is
filled here, from the forward action as it is now: its args (the approved ones when an approver
edited them) and its result. A path the action does not have makes the step fail when its turn
comes, naming the path (``args_error``); the preview says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ledger.models import Action, ActionClass, ApprovalMode, CompensationStrategy, Risk, Run, max_risk
from ledger.policies import ResolvedPolicy, TemplateUnfillable, compensation_args_fill, policy_resolve
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
    # The compensating tool's policy that governs the step (risk, approval); None: nothing to undo.
    policy: dict[str, Any] | None = None
    # Why the step's args cannot be filled from the forward action ("" when they can).
    args_error: str = ""

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
            "policy": self.policy,
            "args_error": self.args_error,
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


def governing_policy(policy: ResolvedPolicy) -> dict[str, Any]:
    """What the plan shows of the policy that governs a step."""
    return {
        "tool": policy.tool,
        "pattern": policy.pattern,
        "scope": policy.scope,
        "risk": policy.risk,
        "approval": policy.approval,
        "source": policy.source,
    }


def step_args(action: Action) -> Any:
    """The compensating tool's args for ``action`` (not a snapshot restore): its literal
    compensation args, or the policy's template filled from the action as it is now. Raises
    ``TemplateUnfillable``."""
    template = (action.policy or {}).get("compensation_args")
    if template is None:
        return action.compensation_args
    return compensation_args_fill(
        template,
        args=action.args,
        result=action.result,
        target_id=action.target_id,
        target_type=action.target_type,
    )


def _step_for(action: Action, resolve: dict[str, ResolvedPolicy]) -> PlanStep:
    strategy = action.compensation_strategy
    tool = action.compensation_tool
    args: Any = None
    notes: list[str] = []
    args_error = ""
    can_undo = True
    if strategy == CompensationStrategy.SNAPSHOT:
        args = action.before_snapshot
        if action.before_snapshot is None:
            can_undo = False
            notes.append("cannot be undone: no before snapshot was recorded to restore")
        elif action.after_snapshot is None:
            notes.append("no after snapshot recorded: drift can only be checked by the compensator itself")
    elif strategy == CompensationStrategy.NONE or not tool:
        can_undo = False
        notes.append(
            "cannot be undone: irreversible and no correction is registered"
            if action.action_class == ActionClass.EXTERNAL_IRREVERSIBLE
            else "cannot be undone"
        )
    else:
        if strategy == CompensationStrategy.CORRECTION:
            notes.append("irreversible: a correction is issued, the original effect stays visible")
        try:
            args = step_args(action)
        except TemplateUnfillable as exc:
            args_error = f"cannot fill the compensation args from the action: {exc}"
            notes.append(f"{args_error}; the step will fail")

    risk = action.risk
    requires_approval = False
    governing: dict[str, Any] | None = None
    if can_undo:
        if tool not in resolve:
            resolve[tool] = policy_resolve(tenant=action.run.tenant, tool=tool)
        comp_policy = resolve[tool]
        governing = governing_policy(comp_policy)
        risk = max_risk(action.risk, comp_policy.risk)
        requires_approval = comp_policy.approval != ApprovalMode.AUTO or action.risk in APPROVAL_RISKS
    served_by = compensators.compensator_describe(tenant_id=action.tenant_id, tool=tool) if can_undo else ""
    if can_undo and not served_by:
        notes.append(f"no compensator is registered for {tool}: the step will fail")
    return PlanStep(
        action=action,
        tool=tool,
        args=args,
        strategy=strategy,
        requires_approval=requires_approval,
        can_undo=can_undo,
        risk=risk,
        compensator=served_by,
        note="; ".join(notes),
        policy=governing,
        args_error=args_error,
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
    # One resolution per compensating tool: a long run undoes the same few tools many times.
    resolved: dict[str, ResolvedPolicy] = {}
    plan = Plan(
        run=run,
        steps=[_step_for(a, resolved) for a in plannable],
        warnings=run_warnings(run=run, actions=actions),
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
