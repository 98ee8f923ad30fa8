"""Approvals as decisions: recording an action its policy gates behind a person (the approval
bound to its exact args), or a plan of them (every approval it needs opened at once), approving,
rejecting and asking again, and settling a decided approval (the forward action, or the
compensation step it gated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import structlog
from django.db import DatabaseError, transaction

from infra import errors
from infra.hashing import sha256_hex
from ledger.audit import Actor, audit_record
from ledger.models import Action, Run
from ledger.policies.deadlines import ApprovalDeadline
from ledger.rules import reason_required
from ledger.services import pauses
from ledger.services.actions import moves as action_moves
from ledger.services.actions import plans, recording
from ledger.services.actions.compensation import CompensatorCheck
from ledger.services.actions.plans import RecordedPlan
from ledger.services.actions.recording import Gate, RecordedAction
from ledger.transitions import run_state_phrase
from recovery import compensators
from recovery.actions.refusals import audits_refusals
from recovery.models import Approval
from recovery.transitions import approvals
from recovery.unwinds import advance, moves

log = structlog.get_logger(__name__)


# The refusals of a record that are audited on the run (the record itself rolled back).
AUDITED_REFUSALS = (
    errors.UnknownCompensator,
    errors.CompensationNotAllowed,
    errors.Paused,
    errors.PolicyDenied,
)


def action_record_gated(*, run: Run, actor: Actor, **fields: Any) -> RecordedAction:
    """Record an action (ledger.action_record, idempotent) and, when its policy demands a human,
    move it to awaiting_approval and open the approval bound to the exact args. With ``start=True``
    (passed through to the ledger, which owns the rule) an action that needs no approval is
    returned running; one that needs approval is gated here as without it.

    The agent's compensation is governed: a tool its policy does not allow, or one that is not a
    registered compensator, is refused (422) and nothing is recorded; so is an action an operator's
    pause covers (409 ``paused``), and one a policy rule or limit denies (403 ``policy_denied``).
    Each refusal is audited on the run."""
    try:
        return _action_record_gated(run=run, actor=actor, **fields)
    except AUDITED_REFUSALS as exc:
        _record_action_refusal(run=run, actor=actor, exc=exc, fields=fields)
        raise


def _record_action_refusal(*, run: Run, actor: Actor, exc: errors.SagaError, fields: dict[str, Any]) -> None:
    """The refused record rolled back; its audit event gets a transaction of its own."""
    compensation = fields.get("compensation") or {}
    log.info("action.refused", code=exc.code, run_id=run.pk, tool=fields.get("tool"), actor=actor.label)
    try:
        with transaction.atomic():
            locked = (
                Run.objects.select_for_update()
                .select_related("tenant")
                .get(pk=run.pk, tenant_id=run.tenant_id)
            )
            audit_record(
                tenant=locked.tenant,
                run=locked,
                actor=actor,
                kind=pauses.ACTION_REFUSED,
                subject=locked,
                reason=exc.message,
                data={
                    "code": exc.code,
                    "tool": fields.get("tool"),
                    "idempotency_key": fields.get("idempotency_key"),
                    "compensation": {"tool": compensation.get("tool"), "args": compensation.get("args")},
                    "details": exc.details,
                },
            )
    except DatabaseError:
        log.warning("action.refusal_not_audited", run_id=run.pk, exc_info=True)


def plan_record_gated(*, run: Run, actor: Actor, actions: Sequence[Mapping[str, Any]]) -> RecordedPlan:
    """Record a plan (``ledger.services.actions.plans.plan_record``: all or nothing, in order),
    each action exactly as ``action_record_gated`` records one: gated when its policy demands a
    human, so every approval the plan needs is opened in its one transaction. A refusal of any
    action records nothing and is audited on the run as the refusal of that action (after the
    plan rolled back: the event must not roll back with it)."""
    try:
        return plans.plan_record(run=run, actor=actor, actions=actions, **_record_hooks(run=run, actor=actor))
    except AUDITED_REFUSALS as exc:
        index = exc.details.get("plan_index")
        refused = actions[index] if isinstance(index, int) and 0 <= index < len(actions) else {}
        _record_action_refusal(run=run, actor=actor, exc=exc, fields=dict(refused))
        raise


def _action_record_gated(*, run: Run, actor: Actor, **fields: Any) -> RecordedAction:
    return recording.action_record(run=run, actor=actor, **_record_hooks(run=run, actor=actor), **fields)


class _RecordHooks(TypedDict):
    is_compensator: CompensatorCheck
    on_gated: Gate


def _record_hooks(*, run: Run, actor: Actor) -> _RecordHooks:
    """What the recovery layer hands the ledger's record: the registered compensators (Python
    ones included) and the gate that opens an approval."""
    tenant_id = run.tenant_id

    def gate(action: Action) -> None:
        # In the record's transaction, with the run as the ledger just locked and read it (its
        # audit chain head current: each event below costs one statement).
        action_moves.action_await_approval(action=action, actor=actor)
        approvals.approval_request(
            run=action.run,
            action=action,
            tool=action.tool,
            args=action.args,
            risk=action.risk,
            actor=actor,
            requested_by=actor.user,
            requested_by_key=actor.key,
            approvers=int((action.policy or {}).get("approvers") or 1),
            # The deadline of the policy that gated it, as frozen on the action.
            deadline=ApprovalDeadline.of(action.policy),
        )

    return {
        "is_compensator": lambda tool, stamp: compensators.compensator_registered(
            tenant_id=tenant_id, tool=tool, stamp=stamp
        ),
        "on_gated": gate,
    }


def approval_settle(
    decided: Approval,
    *,
    actor: Actor,
    reason: str,
    data: dict[str, Any] | None = None,
    edited_args: Any = None,
) -> None:
    """Audit a decided approval (approved, rejected or expired) and hand the decision on to what it
    gated: the forward action (approved, or rejected by a rejection or an expiry), or the unwind
    step. ``edited_args``: the approver's edit of an action's args, which replaces them."""
    audit_record(
        tenant=decided.run.tenant,
        run=decided.run,
        actor=actor,
        kind=f"approval.{decided.status}",
        subject=decided,
        from_state=Approval.Status.PENDING,
        to_state=decided.status,
        reason=reason,
        data=data,
    )
    if decided.kind == Approval.Kind.COMPENSATION:
        advance.step_approval_decided(approval=decided, actor=actor)
    elif decided.status == Approval.Status.APPROVED:
        action_moves.action_approve(action=decided.action, actor=actor, reason=reason, args=edited_args)
    else:
        action_moves.action_reject(action=decided.action, actor=actor, reason=reason)


@audits_refusals("approve")
@transaction.atomic
def approval_approve(
    *, approval: Approval, actor: Actor, reason: str, args: Any = None, shown_args_hash: str | None = None
) -> Approval:
    """Approve exactly what was shown. ``shown_args_hash`` (what the approver's screen showed)
    must still match — compared with the row as it is now, under its lock, not with the caller's
    copy; edited ``args`` replace the action's args and both versions are audited."""
    if shown_args_hash is not None:
        current_hash = (
            Approval.objects.select_for_update(of=("self",))
            .values_list("args_hash", flat=True)
            .get(pk=approval.pk)
        )
        if shown_args_hash != current_hash:
            raise errors.Conflict(
                "The arguments changed since they were shown to you; review them again.",
                details={"approval_id": approval.pk, "args_hash": current_hash},
                code="approval_args_changed",
            )
    edited = args is not None and sha256_hex(args) != approval.args_hash
    updates: dict[str, Any] = {}
    if edited:
        if not isinstance(args, dict):
            raise errors.ValidationFailed(
                "Edited args must be a JSON object.", details={"args": type(args).__name__}
            )
        updates = {"approved_args": args, "approved_args_hash": sha256_hex(args)}
    else:
        updates = {"approved_args": approval.args, "approved_args_hash": approval.args_hash}
    decided = approvals.approval_decide(
        approval, to=Approval.Status.APPROVED, actor=actor, reason=reason, updates=updates
    )
    if decided.status == Approval.Status.PENDING:
        return decided  # a grant of several needed, audited as approval.granted: not decided yet
    approval_settle(
        decided,
        actor=actor,
        reason=reason,
        edited_args=decided.approved_args if edited else None,
        data={
            "args_shown": decided.args,
            "args_approved": decided.approved_args,
            "edited": edited,
            "args_hash": decided.args_hash,
            "approved_args_hash": decided.approved_args_hash,
        },
    )
    return decided


@audits_refusals("reject")
@transaction.atomic
def approval_reject(*, approval: Approval, actor: Actor, reason: str) -> Approval:
    decided = approvals.approval_decide(
        approval, to=Approval.Status.REJECTED, actor=actor, reason=reason, updates={}
    )
    approval_settle(decided, actor=actor, reason=reason)
    return decided


def approval_decide_press(
    *, approval: Approval, actor: Actor, approve: bool, shown_args_hash: str, reason: str
) -> Approval:
    """What a Slack Approve or Reject press decides, pressed in Slack or confirmed in the
    dashboard: an approve grants only the arguments the press's message showed."""
    if approve:
        return approval_approve(
            approval=approval, actor=actor, reason=reason, shown_args_hash=shown_args_hash
        )
    return approval_reject(approval=approval, actor=actor, reason=reason)


@audits_refusals("request_approval_again")
@transaction.atomic
def approval_request_again(*, approval: Approval, actor: Actor, reason: str) -> Approval:
    """Ask again for an ``expired`` or ``rejected`` approval: a new pending approval of the same
    tool and args, linked to the old one (``previous``), audited with who and why. A forward
    action goes back to ``awaiting_approval`` (asked by the agent that owns the run, while the run
    still takes writes); a compensation step goes back to awaiting its approval and its finished
    unwind picks up again (asked by an operator). Pending or approved → 409; someone it does not
    concern → 403 (``approvals.approval_lock_for_asking_again``)."""
    reason = reason_required(reason)
    previous = approvals.approval_lock_for_asking_again(approval, actor=actor)
    if previous.kind == Approval.Kind.COMPENSATION:
        return moves.step_approval_ask_again(approval=previous, actor=actor, reason=reason)
    action = previous.action
    action.run = previous.run
    action_moves.action_await_approval_again(action=action, actor=actor, reason=reason)
    previous.run = action.run  # as the ledger just locked it, with its audit chain head
    return approvals.approval_ask_again(previous=previous, actor=actor, reason=reason)


# --- Approvals nobody needs any more: the run they belong to is over ---------------------------


def action_approvals_lock(*, run: Run) -> list[Approval]:
    """The pending approvals of ``run``'s actions, locked. Taken before the run's own lock, the
    order an approver's decision takes them in (the approval, then the action's move under the
    run's lock), so ending a run while someone approves waits rather than deadlocks."""
    return list(
        Approval.objects.select_for_update(of=("self",))
        .filter(run_id=run.pk, kind=Approval.Kind.ACTION, status=Approval.Status.PENDING)
        .select_related("action")
        .order_by("pk")
    )


def action_approvals_settle_for_end(*, run: Run, actor: Actor, withdraw: bool, ending: str) -> list[Approval]:
    """Before ``run`` ends (``ending``: the status it is about to take, for the words): the actions
    still awaiting approval are refused (``PendingApprovals``, naming each), or with ``withdraw``
    their approvals are withdrawn (``approval.withdrawn``: out of the inbox, a late decision
    refused) and each action is rejected. Returns the withdrawn approvals. Under the run's lock
    (the caller's), so no action of the run is recorded or decided between this and the run's own
    move; ``action_approvals_lock`` first."""
    awaiting = list(
        Action.objects.filter(run_id=run.pk, status=Action.Status.AWAITING_APPROVAL).order_by("seq")
    )
    if not awaiting:
        return []
    if not withdraw:
        several = len(awaiting) != 1
        listed = ", ".join(f"{a.pk} ({a.tool})" for a in awaiting)
        raise errors.PendingApprovals(
            f"Run {run.pk} has {len(awaiting)} action{'s' if several else ''} waiting for approval: "
            f"{listed}. Wait for the decision{'s' if several else ''}, or send withdraw_approvals: "
            f"true to withdraw {'them' if several else 'it'} (the run cannot end while an approver "
            "may still act on it).",
            details={"run_id": run.pk, "action_ids": [a.pk for a in awaiting]},
        )
    reason = f"the run {run_state_phrase(ending)} while it waited"
    pending = {
        approval.action_id: approval
        for approval in Approval.objects.filter(
            action_id__in=[a.pk for a in awaiting], kind=Approval.Kind.ACTION, status=Approval.Status.PENDING
        ).order_by("pk")
    }
    withdrawn = []
    for action in awaiting:
        approval = pending.get(action.pk)
        if approval is not None:
            gone = approvals.approval_withdraw(approval=approval, actor=actor, reason=reason)
            if gone is not None:
                withdrawn.append(gone)
        action.run = run
        action_moves.action_reject(action=action, actor=actor, reason=f"Approval withdrawn: {reason}.")
    return withdrawn
