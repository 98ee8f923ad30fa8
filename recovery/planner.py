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

**Partial compensation.** The operator may undo only some of the plan: chosen ``action_ids``, or
``to_checkpoint`` (what completed after a checkpoint). The steps keep the plan's order (newest
first); the plan's other undoable steps are ``kept`` (their actions stay as they are). After a
checkpoint means: completed after the checkpoint was written, by the run's own completion counter
(``Action.completion_seq > Checkpoint.completion_mark``, both set under the run's row lock) — the
rule the resume preview uses to call a checkpoint stale, so "undo back to X" undoes exactly what
"resume from X" would repeat. The checkpoint's ``completed_action_ids`` are the agent's claim and
play no part.

**The upstream.** An action recorded through a gateway names the upstream that performed it
(``Action.via``). Its step reaches that upstream only through an MCP compensator on the same URL
(``ledger.upstreams``); with any other compensator the step needs a person whatever its policy
says, its ``upstream`` shows where the action was performed and where the compensator goes, its
note and the plan's ``upstream_mismatch`` warning say why, and no automatic compensation starts
(``recovery.actions``). The worker checks again before it calls (``recovery.compensators``).

``plan_hash`` fingerprints the whole plan as the preview shows it (every step, in order: its
action, compensating tool, args, strategy, whether it can be undone and whether it needs an
approval), whatever the selection. The operator sends back the hash they read; a different plan
now (a late action, edited args, a policy that now wants an approver) refuses the compensation
with ``plan_changed`` rather than running what nobody read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from infra import errors
from infra.hashing import sha256_hex
from ledger import upstreams
from ledger.models import (
    Action,
    ActionClass,
    ApprovalMode,
    Checkpoint,
    CompensationStrategy,
    Risk,
    Run,
    max_risk,
)
from ledger.policies.compensation_args import TemplateUnfillable, compensation_args_fill
from ledger.policies.resolve import ResolvedPolicy, policy_resolve
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
    # Where the forward action was performed and whether the compensator reaches it
    # (``ledger.upstreams.Reach``); None when the action names no upstream.
    upstream: dict[str, Any] | None = None

    @property
    def upstream_mismatch(self) -> bool:
        return self.upstream is not None and not self.upstream["reaches"]

    def fingerprint(self) -> dict[str, Any]:
        """What ``plan_hash`` covers of the step: what would run, and who must agree to it."""
        return {
            "action_id": self.action.pk,
            "tool": self.tool,
            "args": self.args,
            "strategy": self.strategy,
            "can_undo": self.can_undo,
            "requires_approval": self.requires_approval,
        }

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
            "upstream": self.upstream,
        }


@dataclass(frozen=True)
class Selection:
    """Which part of the plan an operator chose to undo (``all`` when they did not choose)."""

    mode: str = "all"  # all | action_ids | to_checkpoint
    action_ids: tuple[str, ...] = ()
    checkpoint_id: str | None = None
    checkpoint_name: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "action_ids": list(self.action_ids),
            "checkpoint_id": self.checkpoint_id,
            "checkpoint_name": self.checkpoint_name,
        }


@dataclass
class Plan:
    run: Run
    steps: list[PlanStep] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    # Undoable steps the selection leaves out: their actions stay as they are.
    kept: list[PlanStep] = field(default_factory=list)
    selection: Selection = field(default_factory=Selection)
    # The whole plan's fingerprint (every step, kept or not), as the preview showed it.
    plan_hash: str = ""

    @property
    def unknown_actions(self) -> list[str]:
        return [w["action_id"] for w in self.warnings if w.get("code") == "outcome_unknown"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run.pk,
            "plan_hash": self.plan_hash,
            "steps": [step.as_dict() for step in self.steps],
            "kept": [step.as_dict() for step in self.kept],
            "selection": self.selection.as_dict(),
            "warnings": self.warnings,
            "needs_approval": sum(1 for s in self.steps if s.requires_approval),
            "cannot_undo": sum(1 for s in self.steps if not s.can_undo),
        }


def plan_hash_of(steps: list[PlanStep]) -> str:
    """The fingerprint of an ordered list of steps (see the module's docstring)."""
    return sha256_hex([step.fingerprint() for step in steps])


def governing_policy(policy: ResolvedPolicy) -> dict[str, Any]:
    """What the plan shows of the policy that governs a step; its approval deadline only when it
    sets one (``ledger.policies.deadlines``), so a plan without deadlines hashes as before."""
    governing: dict[str, Any] = {
        "tool": policy.tool,
        "pattern": policy.pattern,
        "scope": policy.scope,
        "risk": policy.risk,
        "approval": policy.approval,
        "source": policy.source,
    }
    if policy.approval_timeout_s is not None:
        governing["approval_timeout_s"] = policy.approval_timeout_s
    if policy.on_timeout != "reject":
        governing["on_timeout"] = policy.on_timeout
        governing["escalate_to"] = policy.escalate_to
    return governing


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
        before=action.before_snapshot,
        after=action.after_snapshot,
        target_id=action.target_id,
        target_type=action.target_type,
    )


def _how_to_undo(action: Action) -> tuple[Any, bool, str, list[str]]:
    """What undoing ``action`` takes, by its compensation strategy (``_step_for``): the args,
    whether it can be undone at all, why its args could not be filled, and the plan's notes."""
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
    return args, can_undo, args_error, notes


def _step_for(
    action: Action,
    resolve: dict[str, ResolvedPolicy],
    described: dict[tuple[int, str], str] | None = None,
) -> PlanStep:
    strategy = action.compensation_strategy
    tool = action.compensation_tool
    args, can_undo, args_error, notes = _how_to_undo(action)
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
    served_by = ""
    if can_undo and described is not None and (action.tenant_id, tool) in described:
        served_by = described[(action.tenant_id, tool)]
    elif can_undo:
        served_by = compensators.compensator_describe(tenant_id=action.tenant_id, tool=tool)
        if described is not None:
            described[(action.tenant_id, tool)] = served_by
    if can_undo and not served_by:
        notes.append(f"no compensator is registered for {tool}: the step will fail")
    reach = None
    if can_undo and action.via is not None:
        reach = upstreams.compensator_reach(
            via=action.via,
            row=compensators.compensator_row(tenant_id=action.tenant_id, tool=tool),
            in_code=served_by == "python",
        )
    if reach is not None and not reach.reaches:
        # Undoing it elsewhere would leave the effect in place and read "compensated": a person
        # checks, whatever the compensating tool's policy says.
        requires_approval = True
        notes.append(reach.mismatch(tool=tool))
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
        upstream={**reach.as_dict(), "message": reach.mismatch(tool=tool)} if reach is not None else None,
    )


def compensation_plan(
    *, run: Run, action_ids: list[str] | None = None, to_checkpoint: str | None = None
) -> Plan:
    """The dry run. Pure read: safe to call from a page render or an API GET.

    With ``action_ids`` or ``to_checkpoint`` (not both: 422) only that part of the plan runs, and
    the rest of its undoable steps are ``kept``. A chosen id that is not an undoable step of this
    plan (another run's action, an unknown id, a read-only or not-succeeded action, one that cannot
    be undone), or a checkpoint that is not this run's, is a 422 naming it."""
    if action_ids is not None and to_checkpoint is not None:
        raise errors.ValidationFailed(
            "Choose the actions to undo or a checkpoint to undo back to, not both.",
            details={"action_ids": action_ids, "to_checkpoint": to_checkpoint},
        )
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
        elif step.upstream_mismatch:
            plan.warnings.append(
                {
                    "code": "upstream_mismatch",
                    "action_id": step.action.pk,
                    "message": f"{step.action.tool} (#{step.action.seq}): "
                    + str((step.upstream or {}).get("message", ""))
                    + ".",
                }
            )
    plan.plan_hash = plan_hash_of(plan.steps)
    if action_ids is not None:
        _select_actions(plan, actions, action_ids)
    elif to_checkpoint is not None:
        _select_after_checkpoint(plan, to_checkpoint)
    return plan


def _select_actions(plan: Plan, actions: list[Action], action_ids: list[str]) -> None:
    chosen = list(dict.fromkeys(str(a) for a in action_ids))  # de-duplicated, in the order given
    if not chosen:
        raise errors.ValidationFailed("Choose at least one action to undo.", details={"action_ids": []})
    by_id = {step.action.pk: step for step in plan.steps}
    of_run = {a.pk: a for a in actions}
    refused: dict[str, str] = {}
    for action_id in chosen:
        step = by_id.get(action_id)
        action = of_run.get(action_id)
        if action is None:
            # Another run's action and an id that exists nowhere read the same: nothing leaks.
            refused[action_id] = "is not an action of this run"
        elif step is None:
            why = (
                "read-only: it changed nothing"
                if action.action_class == ActionClass.READ_ONLY
                else f"{action.status}: only a succeeded action can be undone"
            )
            refused[action_id] = f"({action.tool} #{action.seq}) is not undoable: it is {why}"
        elif not step.can_undo:
            refused[action_id] = f"({action.tool} #{action.seq}) {step.note}"
    if refused:
        raise errors.ValidationFailed(
            "Cannot undo " + "; ".join(f"{aid} {why}" for aid, why in refused.items()) + ".",
            details={"action_ids": list(refused), "reasons": refused},
        )
    picked = set(chosen)
    _partition(plan, lambda step: step.action.pk in picked)
    plan.selection = Selection(mode="action_ids", action_ids=tuple(s.action.pk for s in plan.steps))


def _select_after_checkpoint(plan: Plan, checkpoint_id: str) -> None:
    if not checkpoint_id:
        raise errors.ValidationFailed("Choose the checkpoint to undo back to.", details={"to_checkpoint": ""})
    checkpoint = Checkpoint.objects.filter(pk=str(checkpoint_id)[:40], run_id=plan.run.pk).first()
    if checkpoint is None:
        raise errors.ValidationFailed(
            f"Checkpoint {checkpoint_id} is not a checkpoint of this run.",
            details={"to_checkpoint": checkpoint_id},
        )
    _partition(plan, lambda step: (step.action.completion_seq or 0) > checkpoint.completion_mark)
    if not plan.steps:
        raise errors.ValidationFailed(
            f"Nothing to undo: no action that changed something completed after checkpoint "
            f"{checkpoint.name} ({checkpoint.pk}).",
            details={"to_checkpoint": checkpoint.pk},
        )
    plan.selection = Selection(
        mode="to_checkpoint",
        action_ids=tuple(s.action.pk for s in plan.steps),
        checkpoint_id=checkpoint.pk,
        checkpoint_name=checkpoint.name,
    )


def _partition(plan: Plan, chosen: Callable[[PlanStep], bool]) -> None:
    """Keep the chosen steps (in plan order); the other undoable ones are kept as they are. A step
    that cannot be undone and was not chosen is neither: the trail lists it as not undone."""
    steps, kept = [], []
    for step in plan.steps:
        if chosen(step):
            steps.append(step)
        elif step.can_undo:
            kept.append(step)
    plan.steps, plan.kept = steps, kept


def runs_needing_approval(actions: Iterable[Action]) -> set[str]:
    """The runs among ``actions``' whose whole compensation plan has a step an approver must grant
    (by ``_step_for``'s rule, the plan's own): what a bulk compensation's preview counts. ``actions``:
    the runs' actions, any order, ``run__tenant`` selected; each tenant's policy and compensator are
    looked up once for however many runs."""
    resolved: dict[int, dict[str, ResolvedPolicy]] = {}
    described: dict[tuple[int, str], str] = {}
    needing: set[str] = set()
    for action in actions:
        if action.run_id in needing:
            continue
        if action.status not in PLANNABLE_STATUSES or action.action_class == ActionClass.READ_ONLY:
            continue
        step = _step_for(action, resolved.setdefault(action.tenant_id, {}), described)
        if step.requires_approval:
            needing.add(action.run_id)
    return needing
