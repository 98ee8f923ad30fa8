"""What an approval card says will happen, computed here once; the templates only render it.

A forward action's card shows the action the agent asks to run. A compensation's card shows the
compensating tool and the exact args that will run, the target's state as the forward action left
it (its after-state: that is what the compensation starts from), a predicted change only where one
can be computed (a snapshot restore), and who decided the compensation and why; the forward
action's own reasoning is shown labelled as the forward action's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from dashboard.templatetags.dashboard import confidence
from ledger.models import Action, ApprovalMode, CompensationStrategy
from recovery.deadline_words import deadline_line, escalated_words
from recovery.models import Approval, Unwind, UnwindStep
from recovery.planner import APPROVAL_RISKS
from recovery.unwinds.state import planned_step


@dataclass(frozen=True)
class CardFact:
    """One labelled line of a card; ``data`` (shown as JSON) when ``has_data``."""

    label: str
    text: str = ""
    data: Any = None
    has_data: bool = False

    @property
    def wide(self) -> bool:
        return len(self.text) > 40


@dataclass(frozen=True)
class CardPrediction:
    """What approving will change. ``diff``: a field-by-field table from ``diff_from`` (labelled
    ``from_label``) to ``diff_to``; otherwise only ``sentence``, which says plainly what is known,
    and ``given``, what the compensator is handed to decide with."""

    sentence: str
    diff: bool = False
    diff_from: Any = None
    diff_to: Any = None
    from_label: str = ""
    to_label: str = ""
    given: tuple[CardFact, ...] = ()


@dataclass(frozen=True)
class ApprovalCardContent:
    approval: Approval
    compensation: bool
    # Who asked for the approval: the agent (forward action), whoever decided the compensation.
    asked_by: str
    # One sentence: what approving runs (compensations; "" for a forward action).
    summary: str
    facts: tuple[CardFact, ...]
    args: Any
    args_heading: str
    # Where the args come from (a compensation: its template, or the agent's, or the snapshot).
    args_source: str
    args_note: str
    state: Any
    state_heading: str
    # Said instead of the state when none was recorded.
    state_missing: str
    prediction: CardPrediction | None
    # The agent's reasoning: this action's, or (compensation) the forward action's, so labelled.
    reasoning: str
    reasoning_label: str
    confidence: str
    # Its deadline in words, while it is pending ("Decide by 14:05 UTC (in 12 minutes); then it
    # is rejected."), and whether it escalated ("escalated to admin at 13:05 UTC: …").
    deadline: str = ""
    escalated: str = ""


def _target(action: Action) -> str:
    if not action.target_id:
        return ""
    return f"{action.target_type}:{action.target_id}" if action.target_type else action.target_id


def _policy_line(policy: dict[str, Any] | None) -> str:
    if not policy:
        return ""
    return (
        f"{policy.get('pattern') or policy.get('tool')} ({policy.get('scope') or 'global'} policy) · "
        f"{policy.get('risk')} risk · {policy.get('approval')} approval"
    )


def grants_line(approval: Approval) -> str:
    """ "1 of 2 approvers (alice)" for an approval that needs several people; "" for one."""
    if approval.approvers_required <= 1:
        return ""
    grants = list(approval.grants.all())
    who = f" ({', '.join(g.label or g.approver for g in grants)})" if grants else ""
    return f"{len(grants)} of {approval.approvers_required} approvers{who}"


def _rule_words(rule: dict[str, Any]) -> str:
    """A rule that applied, and why when a value's kind decided it: the approver must know that
    the agent sent, say, the amount as text, and that the rule applied because of that."""
    words = f"Rule {rule.get('index')}: {rule.get('description')}"
    undecided = rule.get("undecided")
    if isinstance(undecided, list) and undecided:
        paths = ", ".join(str(path) for path in undecided)
        words += f" (applied because the value at {paths} is not of the kind the rule compares)"
    return words


def policy_decision_facts(policy: dict[str, Any] | None) -> list[CardFact]:
    """The rule and the limit that decided an action's risk and approval, in words."""
    facts = []
    policy = policy or {}
    rule = policy.get("rule")
    if isinstance(rule, dict):
        also = rule.get("also")
        words = "; ".join(
            _rule_words(r) for r in [rule, *(also if isinstance(also, list) else [])] if isinstance(r, dict)
        )
        facts.append(CardFact("Rule that applied", words))
    limit = policy.get("limit")
    if isinstance(limit, dict):
        facts.append(
            CardFact(
                "Limit reached",
                f"Limit {limit.get('index')}: {limit.get('description')} "
                + (
                    f"(already {limit.get('used')} in the window)."
                    if limit.get("used") is not None
                    else "(the window holds an amount that is not a number, so no room can be shown)."
                ),
            )
        )
    return facts


def _reasoning(intent: Any) -> str:
    return str(intent.get("reasoning") or "") if isinstance(intent, dict) else ""


def _shown_args(approval: Approval) -> tuple[Any, str]:
    """The args that run: the approved ones once an approver edited them, else those shown."""
    if (
        approval.status == Approval.Status.APPROVED
        and approval.approved_args_hash
        and approval.approved_args_hash != approval.args_hash
    ):
        return approval.approved_args, "Approved with edited arguments (the ones asked for were different)."
    return approval.args, ""


def approval_card_content(approval: Approval) -> ApprovalCardContent:
    """The card of ``approval``, with its deadline (``recovery.deadline_words``)."""
    content = _card_content(approval)
    pending = approval.status == Approval.Status.PENDING
    return replace(
        content,
        deadline=deadline_line(approval) if pending else "",
        escalated=escalated_words(approval),
    )


def _card_content(approval: Approval) -> ApprovalCardContent:
    """The card of ``approval``. Reads only what ``selectors.inbox.approvals_pending`` selects
    with it (for a compensation: its step, the step's unwind and who requested it), so the inbox
    stays one query per page."""
    if approval.kind == Approval.Kind.COMPENSATION and approval.step is not None:
        return _compensation_card(approval, approval.step)
    action = approval.action
    args, args_note = _shown_args(approval)
    facts = []
    if policy := _policy_line(action.policy):
        facts.append(CardFact("Policy", policy))
    facts.extend(policy_decision_facts(action.policy))
    if grants := grants_line(approval):
        facts.append(
            CardFact("Approvers", f"{grants}: it needs {approval.approvers_required} different people.")
        )
    if approval.requested_by_key is not None:
        asked_by = f"agent key {approval.requested_by_key.name}"
    else:
        asked_by = approval.requested_by.get_username() if approval.requested_by is not None else ""
    return ApprovalCardContent(
        approval=approval,
        compensation=False,
        asked_by=asked_by,
        summary="",
        facts=tuple(facts),
        args=args,
        args_heading="Arguments",
        args_source="",
        args_note=args_note,
        state=action.before_snapshot,
        state_heading="Before (current state as recorded)",
        state_missing="Not recorded: the agent sent no before-state with this action.",
        prediction=None,
        reasoning=_reasoning(action.intent),
        reasoning_label="Agent’s reasoning",
        confidence=confidence(action.intent),
    )


def _decider(unwind: Unwind) -> str:
    """Who or what decided the compensation this step belongs to."""
    if unwind.automatic:
        return "automatic compensation"
    if unwind.requested_by is not None:
        return unwind.requested_by.get_username()
    if unwind.requested_by_key is not None:
        return f"operator key {unwind.requested_by_key.name}"
    return ""


def _decided_by(unwind: Unwind) -> CardFact:
    """Who or what decided the compensation, and their reason: the rationale of the step."""
    who = _decider(unwind)
    if unwind.automatic:
        who = "Automatic compensation: no person decided it"
    elif unwind.requested_by is not None:
        who = f"{who} (operator)"
    reason = unwind.reason.strip()
    who = who or "not recorded"
    return CardFact("Compensation decided by", f"{who} — “{reason}”" if reason else who)


def _why_a_person(planned: dict[str, Any], action: Action) -> str:
    """The planner's rule (``planner._step_for``) in words: the compensating tool's policy asks
    for a person, or the action it undoes is high or critical risk."""
    reasons = []
    policy = planned.get("policy") or {}
    if policy.get("approval") and policy["approval"] != ApprovalMode.AUTO:
        reasons.append(f"the compensating tool’s policy asks for a person ({policy['approval']} approval)")
    if action.risk in APPROVAL_RISKS:
        reasons.append(
            f"it undoes a {action.risk}-risk action, and undoing a high or critical one always does"
        )
    return "; ".join(reasons)


def _args_source(action: Action, strategy: str, forward: str) -> str:
    """Where a compensation step's args came from (``planner.step_args``: filled at plan time)."""
    if strategy == CompensationStrategy.SNAPSHOT:
        return f"Built from the before-state recorded by {forward}."
    template = (action.policy or {}).get("compensation_args")
    if template is None:
        return f"As the agent gave them with {forward}’s compensation."
    if template == "$args":
        return (
            f"Filled when planned from {forward}’s own arguments (the approved ones, if an approver "
            "edited them)."
        )
    return f"Filled from the policy’s template {json.dumps(template, ensure_ascii=False, sort_keys=True)}."


def _compensation_summary(
    approval: Approval, planned: dict[str, Any], strategy: str, *, forward: str, target: str, served: str
) -> tuple[str, str]:
    """What approving the step runs, in one sentence, and the heading of the args it runs with."""
    if strategy == CompensationStrategy.SNAPSHOT:
        summary = f"Runs {approval.tool} to restore {target} to the state recorded before {forward}."
        args_heading = f"Arguments it will run with (the state to restore, recorded before {forward})"
    elif strategy == CompensationStrategy.CORRECTION:
        summary = (
            f"Runs {approval.tool} to correct {forward} on {target}. {forward} cannot be undone: a "
            "correcting action is issued and the original effect stays visible."
        )
        args_heading = "Arguments it will run with"
    else:
        summary = f"Runs {approval.tool} to undo {forward} on {target}."
        args_heading = "Arguments it will run with"
    if served:
        summary += f" Served by a {served} compensator."
    upstream = planned.get("upstream") or {}
    if upstream and not upstream.get("reaches"):
        # Why this step waits for a person even when its policy is automatic (recovery.planner).
        summary += f" Careful — {upstream.get('message', '')}."
    return summary, args_heading


def _compensation_facts(
    approval: Approval, step: UnwindStep, planned: dict[str, Any], *, served: str
) -> list[CardFact]:
    """Who decided the compensation, the step's place in it, the policy that governs the step,
    why a person approves it, and what will make it fail."""
    action = approval.action
    unwind = step.unwind
    facts = [_decided_by(unwind)]
    selection = (unwind.plan or {}).get("selection") or {}
    steps = len((unwind.plan or {}).get("steps") or []) or None
    where = f"Step {step.position + 1}" + (f" of {steps}" if steps else "")
    if selection.get("mode") == "action_ids":
        where += " of a partial compensation (only the chosen actions are undone)"
    elif selection.get("mode") == "to_checkpoint":
        where += f" of a compensation back to checkpoint {selection.get('checkpoint_name') or ''}".rstrip()
    facts.append(CardFact("Place in the compensation", where + "."))
    if policy := _policy_line(planned.get("policy")):
        facts.append(CardFact("Policy that governs it", policy))
    if why := _why_a_person(planned, action):
        facts.append(CardFact("Why a person approves it", why[0].upper() + why[1:] + "."))
    if args_error := str(planned.get("args_error") or ""):
        facts.append(CardFact("Warning", f"{args_error[0].upper()}{args_error[1:]}: the step will fail."))
    if planned and not served:
        facts.append(
            CardFact("Warning", f"No compensator is registered for {approval.tool}: the step will fail.")
        )
    return facts


def _compensation_card(approval: Approval, step: UnwindStep) -> ApprovalCardContent:
    action = approval.action
    unwind = step.unwind
    planned = planned_step(unwind, step)
    strategy = step.strategy or action.compensation_strategy
    args, args_note = _shown_args(approval)
    target = _target(action) or "its target"
    forward = f"#{action.seq} {action.tool}"
    served = str(planned.get("compensator") or "")

    summary, args_heading = _compensation_summary(
        approval, planned, strategy, forward=forward, target=target, served=served
    )
    if args is None and not args_note:
        args_note = "None: the compensator works from the target and the recorded states."

    facts = _compensation_facts(approval, step, planned, served=served)

    return ApprovalCardContent(
        approval=approval,
        compensation=True,
        asked_by=_decider(unwind),
        summary=summary,
        facts=tuple(facts),
        args=args,
        args_heading=args_heading,
        args_source=_args_source(action, strategy, forward),
        args_note=args_note,
        state=action.after_snapshot,
        state_heading=f"Current state (as recorded after {forward})",
        state_missing=f"Not recorded: {forward} reported no after-state, so the current state is not known here.",
        prediction=_prediction(approval, step, strategy, args=args, forward=forward, target=target),
        reasoning=_reasoning(action.intent),
        reasoning_label=f"The agent’s reasoning for {forward} (the action being undone, not this compensation)",
        confidence=confidence(action.intent),
    )


def _prediction(
    approval: Approval, step: UnwindStep, strategy: str, *, args: Any, forward: str, target: str
) -> CardPrediction:
    action = approval.action
    before, after = action.before_snapshot, action.after_snapshot
    if strategy == CompensationStrategy.SNAPSHOT:
        if after is None:
            return CardPrediction(
                f"No prediction: {forward} recorded no after-state to compare with. The restore sets "
                f"{target} to the arguments shown."
            )
        return CardPrediction(
            f"Field by field, from {target} as {forward} left it to the state the restore writes.",
            diff=True,
            diff_from=after,
            diff_to=args,
            from_label="Now",
            to_label="After the restore",
        )
    if strategy == CompensationStrategy.CORRECTION:
        known = (
            f"A correction restores nothing: {forward}’s effect stays, and {approval.tool} acts on top of it."
        )
    elif before is None:
        known = (
            f"{approval.tool} undoes what {forward} did to {target}. {forward} recorded no "
            f"before-state: what {target} was before it is not known here (nothing, if {forward} "
            "created it)."
        )
    else:
        known = (
            f"{approval.tool} is to bring {target} back from the state {forward} left to the one "
            "recorded before it."
        )
    none_recorded = "none recorded"
    given = (
        CardFact("Arguments", "the arguments shown" if args is not None else "none"),
        CardFact("Target", _target(action) or none_recorded),
        CardFact(
            f"After-state of {forward}", "the current state shown" if after is not None else none_recorded
        ),
        CardFact(
            f"Before-state of {forward}", none_recorded if before is None else "", before, before is not None
        ),
        CardFact("Idempotency key", f"{step.idempotency_key} (the same on every attempt)"),
    )
    return CardPrediction(
        f"{known} No prediction of the change: the compensator decides what it does. It is given:",
        given=given,
    )
