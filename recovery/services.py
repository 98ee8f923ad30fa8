"""The decisions about a run, as the dashboard and the API call them (neither re-implements a
rule): the agent's reports that put a run in the queue, recording an action that needs approval,
approving and rejecting, resuming, closing and compensating, retrying or skipping a step, bulk
decisions, and the periodic duties that decide (expiring approvals, failing lost agents).

The layers below: ``items``, ``approvals`` and ``commands`` (each object's own transitions), then
``unwinds`` (the engine) and ``sweeper``. Nothing below imports this module.

Each function checks state in the database (compare-and-set or a row lock), writes its audit
event in the same transaction, and defers side effects (jobs, notifications) to on_commit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import structlog
from django.db import DatabaseError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from ledger import errors
from ledger.audit import Actor, audit_record
from ledger.conf import saga
from ledger.hashing import sha256_hex
from ledger.models import RISK_ORDER, Action, Checkpoint, Risk, Run
from ledger.policies.resolve import policy_settings_for
from ledger.rules import reason_required
from ledger.services import runs
from ledger.services.actions import moves, recording
from ledger.services.actions.recording import RecordedAction
from recovery import approvals, commands, compensators, decisions, items, selectors, unwinds
from recovery.models import AgentCommand, Approval, RecoveryItem, Unwind, UnwindStep
from recovery.planner import Plan, compensation_plan

log = structlog.get_logger("saga_admin.decisions")

Decision = TypeVar("Decision", bound=Callable[..., Any])


def _audits_refusals(decision: str) -> Callable[[Decision], Decision]:
    """A refused operator decision (the loser of a race, a stale tab, four eyes, a missing reason)
    rolls its own transaction back, audit event included, so the log would only show winners.
    Record the refusal afterwards in a transaction of its own: the audit log then has every
    attempt, and the one error still reaches the caller unchanged (API 4xx, dashboard message).

    Written here rather than in the API and the views so both, and any future caller, get it. Inside
    a caller's transaction (a bulk action's per-item savepoint) the event shares that transaction's
    fate; bulk refusals are reported per item in its outcome list."""

    def decorate(fn: Decision) -> Decision:
        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            try:
                return fn(**kwargs)
            except errors.SagaError as exc:
                _record_refusal(decision=decision, exc=exc, **kwargs)
                raise

        return wrapper  # type: ignore[return-value]

    return decorate


def _record_refusal(
    *, decision: str, exc: errors.SagaError, actor: Actor, reason: str = "", **kwargs: Any
) -> None:
    subject = (
        kwargs.get("item")
        or kwargs.get("approval")
        or kwargs.get("step")
        or kwargs.get("unwind")
        or kwargs.get("run")
    )
    if subject is None:
        return
    # A run is its own subject; the others name their run (a step through its unwind).
    run_id = (
        subject.pk
        if isinstance(subject, Run)
        else (getattr(subject, "run_id", None) or subject.unwind.run_id)
    )
    current = str(exc.details.get("current", "")) if isinstance(exc.details, dict) else ""
    log.info(
        "decision.refused",
        decision=decision,
        code=exc.code,
        run_id=run_id,
        subject=subject.pk,
        current=current,
        actor=actor.label,
    )
    try:
        with transaction.atomic():
            run = Run.objects.select_related("tenant").get(pk=run_id)
            audit_record(
                tenant=run.tenant,
                run=run,
                actor=actor,
                kind="decision.refused",
                subject=subject,
                from_state=current,
                to_state=decision,
                reason=exc.message,
                data={"decision": decision, "code": exc.code, "status": exc.status, "reason_given": reason},
            )
    except DatabaseError:
        # The refusal itself must still reach the operator; the log line above keeps the trace.
        log.warning("decision.refusal_not_audited", decision=decision, run_id=run_id, exc_info=True)


def refusal_record(
    *, decision: str, exc: errors.SagaError, actor: Actor, reason: str = "", **subject: Any
) -> None:
    """Audit a decision refused before any service ran (the dashboard refusing a stale tab's POST
    for a decision ``recovery.decisions`` no longer offers), like the services' own refusals."""
    _record_refusal(decision=decision, exc=exc, actor=actor, reason=reason, **subject)


@dataclass(frozen=True)
class FailOutcome:
    run: Run
    item: RecoveryItem | None
    unwind: Unwind | None = None  # when the failure was auto-compensated


@transaction.atomic
def run_fail_and_queue(
    *, run: Run, actor: Actor, error: str, reason: str = "failed", failed_action: Action | None = None
) -> FailOutcome:
    """The agent reports its run failed: record it and put the run in the recovery queue."""
    item_reason = reason if reason in RecoveryItem.Reason.values else RecoveryItem.Reason.FAILED
    runs.run_fail(run=run, actor=actor, error=error, reason=item_reason, failed_action=failed_action)
    resumed = _resume_failed_again(run=run, actor=actor)
    item = items.item_open_or_update(
        run=run,
        reason=item_reason,
        actor=actor,
        failed_action=failed_action,
        error=f"{error} {resumed.note}" if resumed else error,
        details={"resumed": resumed.details} if resumed else None,
    )
    if resumed:
        # A person decided this run should go on: whether to undo it now is theirs to decide too.
        _withhold_auto_compensation(run=run, item=item, note=resumed.note)
        return FailOutcome(run=run, item=item)
    unwind = _auto_compensate(run=run, item=item)
    if unwind is not None:
        item.refresh_from_db()
    return FailOutcome(run=run, item=item, unwind=unwind)


@dataclass(frozen=True)
class _Resumed:
    note: str
    details: dict[str, Any]


def _resume_failed_again(*, run: Run, actor: Actor) -> _Resumed | None:
    """The run failed after someone resumed it. A resume its agent never acknowledged no longer
    stands: it is cancelled (so the agent, if it comes back, does not act on it). Returns what
    the recovery item says about it, or None when the run was never resumed."""
    latest = (
        AgentCommand.objects.filter(run_id=run.pk, kind=AgentCommand.Kind.RESUME)
        .select_related("created_by")
        .order_by("-created_at")
        .first()
    )
    if latest is None:
        return None
    cancelled = commands.commands_cancel_pending(
        run=run, actor=actor, reason="The run failed again before its agent acknowledged the resume."
    )
    picked_up = latest.status == AgentCommand.Status.ACKED
    by, at = latest.issued_by(), f"{latest.created_at:%Y-%m-%d %H:%M} UTC"
    note = (
        f"Resumed by {by} at {at}; the agent picked it up at {latest.acked_at:%H:%M} UTC and the run "
        "failed again. Not compensated automatically: a person decides."
        if picked_up and latest.acked_at
        else f"Resumed by {by} at {at}; the agent never picked the resume up. Not compensated "
        "automatically: a person decides."
    )
    return _Resumed(
        note=note,
        details={
            "command_id": latest.pk,
            "by": by,
            "at": latest.created_at.isoformat(),
            "picked_up": picked_up,
            "cancelled_command_ids": [c.pk for c in cancelled],
        },
    )


def _withhold_auto_compensation(*, run: Run, item: RecoveryItem, note: str) -> None:
    """Audit that the policy would have compensated the run without a person, and did not."""
    max_allowed = _auto_compensable(run)
    if max_allowed is None:
        return
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=AUTO_COMPENSATOR,
        kind="recovery.auto_compensation_withheld",
        subject=item,
        reason=note,
        data={"max_risk": max_allowed},
    )


def action_fail_and_queue(
    *, action: Action, actor: Actor, error: str, retryable: bool, layer: str, outcome_unknown: bool = False
) -> Action:
    """An action failed; a timed-out call whose outcome is unknown also queues the run, because a
    human (or a reader) must confirm whether it happened before anything resumes or undoes it. A
    plain failure is the ledger's one write; an unknown outcome opens the item in its transaction."""
    fail = functools.partial(
        moves.action_fail,
        action=action,
        actor=actor,
        error=error,
        retryable=retryable,
        layer=layer,
        outcome_unknown=outcome_unknown,
    )
    if not outcome_unknown:
        return fail()
    with transaction.atomic():
        fail()
        items.item_open_or_update(
            run=action.run,
            reason=RecoveryItem.Reason.OUTCOME_UNKNOWN,
            actor=actor,
            failed_action=action,
            error=error,
        )
    return action


@transaction.atomic
def action_verify_and_queue(
    *, action: Action, actor: Actor, ok: bool, expected: Any = None, actual: Any = None, reason: str = ""
) -> tuple[Action, RecoveryItem | None]:
    """A verification mismatch fails the run (if it was still running or had succeeded) and puts
    it in the recovery queue as ``verification_failed``."""
    moves.action_verify(action=action, actor=actor, ok=ok, expected=expected, actual=actual, reason=reason)
    if ok:
        return action, None
    run = Run.objects.select_for_update().get(pk=action.run_id)
    message = reason or "verification failed: the action's effect is not what was expected"
    if run.status in (Run.Status.RUNNING, Run.Status.SUCCEEDED):
        runs.run_fail(
            run=run,
            actor=actor,
            error=message,
            reason=RecoveryItem.Reason.VERIFICATION_FAILED,
            failed_action=action,
        )
        commands.commands_cancel_pending(
            run=run, actor=actor, reason="The run failed again before its agent acknowledged the resume."
        )
    item = items.item_open_or_update(
        run=run,
        reason=RecoveryItem.Reason.VERIFICATION_FAILED,
        actor=actor,
        failed_action=action,
        error=message,
        details={"verification": {"expected": expected, "actual": actual}},
    )
    return action, item


# --- Approvals ---------------------------------------------------------------------------------


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
    except (
        errors.UnknownCompensator,
        errors.CompensationNotAllowed,
        errors.Paused,
        errors.PolicyDenied,
    ) as exc:
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
                kind="action.refused",
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


def _action_record_gated(*, run: Run, actor: Actor, **fields: Any) -> RecordedAction:
    tenant_id = run.tenant_id

    def gate(action: Action) -> None:
        # In the record's transaction, with the run as the ledger just locked and read it (its
        # audit chain head current: each event below costs one statement).
        moves.action_await_approval(action=action, actor=actor)
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
        )

    return recording.action_record(
        run=run,
        actor=actor,
        is_compensator=lambda tool, stamp: compensators.compensator_registered(
            tenant_id=tenant_id, tool=tool, stamp=stamp
        ),
        on_gated=gate,
        **fields,
    )


def _settle(
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
        unwinds.step_approval_decided(approval=decided, actor=actor)
    elif decided.status == Approval.Status.APPROVED:
        moves.action_approve(action=decided.action, actor=actor, reason=reason, args=edited_args)
    else:
        moves.action_reject(action=decided.action, actor=actor, reason=reason)


@_audits_refusals("approve")
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
    _settle(
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


@_audits_refusals("reject")
@transaction.atomic
def approval_reject(*, approval: Approval, actor: Actor, reason: str) -> Approval:
    decided = approvals.approval_decide(
        approval, to=Approval.Status.REJECTED, actor=actor, reason=reason, updates={}
    )
    _settle(decided, actor=actor, reason=reason)
    return decided


@_audits_refusals("request_approval_again")
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
        return unwinds.step_approval_ask_again(approval=previous, actor=actor, reason=reason)
    action = previous.action
    action.run = previous.run
    moves.action_await_approval_again(action=action, actor=actor, reason=reason)
    previous.run = action.run  # as the ledger just locked it, with its audit chain head
    return approvals.approval_ask_again(previous=previous, actor=actor, reason=reason)


def approvals_expire_due(*, now: datetime | None = None) -> int:
    """Expire pending approvals past their deadline (a periodic job). The gated action becomes
    rejected, so an agent polling it sees ``expired`` and start() refuses; a gated compensation
    step fails without running, and its unwind goes on."""
    now = now or timezone.now()
    expired = 0
    for approval_id in Approval.objects.filter(
        status=Approval.Status.PENDING, expires_at__lte=now
    ).values_list("pk", flat=True):
        with transaction.atomic():
            approval = approvals.approval_expire(approval_id=approval_id, now=now)
            if approval is None:
                continue
            _settle(approval, actor=Actor.system("approval-expiry"), reason="approval expired")
            expired += 1
    return expired


# --- Unwinds, resume and close (the operator's decisions) -----------------------------------

AUTO_COMPENSATOR = Actor.system("auto-compensate")


def _refuse_unknown_outcomes(plan_or_actions: Plan | list[Action], *, doing: str) -> None:
    unknown = (
        plan_or_actions.unknown_actions
        if isinstance(plan_or_actions, Plan)
        else [a.pk for a in plan_or_actions]
    )
    if unknown:
        raise errors.Conflict(
            f"Cannot {doing}: {len(unknown)} action(s) timed out with an unknown outcome. Reconcile them "
            "first (confirm whether each happened).",
            details={"unknown_action_ids": unknown},
            code="outcome_unknown",
        )


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


@_audits_refusals("compensate")
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
    _refuse_unknown_outcomes(plan, doing="compensate")
    _refuse_running_actions(run, doing="compensate")
    if plan_hash is not None and plan_hash != plan.plan_hash:
        raise errors.PlanChanged(
            "The compensation plan changed since you read it (an action finished, or its arguments "
            "or policy changed). Nothing was started; review the new plan.",
            details={"plan_hash": plan.plan_hash, "shown_plan_hash": plan_hash, "run_id": run.pk},
        )
    runs.run_compensation_started(run=run, actor=actor, reason=reason)
    commands.commands_cancel_pending(run=run, actor=actor, reason="The run is being compensated.")
    return unwinds.unwind_create(
        run=run, item=item, plan=plan, actor=actor, reason=reason, automatic=automatic
    )


def _auto_compensate(*, run: Run, item: RecoveryItem) -> Unwind | None:
    """Unwind without a human when the run qualifies (``_auto_compensable``). A step whose policy
    still wants an approver waits for one even then."""
    max_allowed = _auto_compensable(run)
    if max_allowed is None:
        return None
    return unwind_start(
        item=item,
        actor=AUTO_COMPENSATOR,
        automatic=True,
        reason=f"auto-compensation: every action and compensating tool is at or under {max_allowed} risk",
    )


def _auto_compensable(run: Run) -> str | None:
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


@_audits_refusals("resume")
@transaction.atomic
def item_resume(
    *, item: RecoveryItem, actor: Actor, reason: str, checkpoint: Checkpoint | None = None
) -> AgentCommand:
    """Resolve the item as resumed, put the run back to running and queue a resume command for
    the agent (pulled on heartbeat, pushed to resume_url when set)."""
    reason = reason_required(reason)
    item = RecoveryItem.objects.select_related("run__tenant").get(pk=item.pk)
    preview = selectors.resume_preview(item=item, checkpoint=checkpoint)
    _refuse_unknown_outcomes(preview.unknown, doing="resume")
    if preview.compensate_only and preview.checkpoint is not None:
        raise errors.Conflict(
            f"Checkpoint {preview.checkpoint.name} allows compensation only.",
            details={"checkpoint_id": preview.checkpoint.pk},
            code="resume_not_allowed",
        )
    items.item_resolve(
        item=item,
        actor=actor,
        resolution=RecoveryItem.Resolution.RESUMED,
        note=reason,
        allowed_from=decisions.DECIDABLE_ITEM,
        details={
            "resume": {
                "checkpoint_id": getattr(preview.checkpoint, "pk", None),
                "warnings": [w["code"] for w in preview.warnings],
            }
        },
    )
    run = Run.objects.select_for_update().select_related("tenant").get(pk=item.run_id)
    runs.run_resume(run=run, actor=actor, reason=reason)
    return commands.command_issue(
        run=run, kind=AgentCommand.Kind.RESUME, actor=actor, reason=reason, checkpoint=preview.checkpoint
    )


@_audits_refusals("close")
@transaction.atomic
def item_close(*, item: RecoveryItem, actor: Actor, reason: str) -> RecoveryItem:
    """Resolve the item as closed (a reason is required); a failed or cancelled run is closed too."""
    reason = reason_required(reason)
    item = RecoveryItem.objects.select_related("run__tenant").get(pk=item.pk)
    items.item_resolve(
        item=item,
        actor=actor,
        resolution=RecoveryItem.Resolution.CLOSED,
        note=reason,
        allowed_from=decisions.DECIDABLE_ITEM,
    )
    run = Run.objects.select_for_update().select_related("tenant").get(pk=item.run_id)
    if run.status in (Run.Status.FAILED, Run.Status.CANCELLED):
        runs.run_close(run=run, actor=actor, reason=reason)
        commands.commands_cancel_pending(run=run, actor=actor, reason="The run was closed.")
    return item


@_audits_refusals("flag")
@transaction.atomic
def run_flag(*, run: Run, actor: Actor, reason: str) -> RecoveryItem:
    """Put a run in front of a person (a recovery item, reason ``manual``), whatever its status: a
    ``succeeded`` run whose outcome must be undone after all (HR cancelled the hire), or any run
    someone wants reviewed. It can then be compensated (or partly), resumed or closed like a
    failed run. A run already in the queue keeps its item and its more specific reason; the flag
    is added to the item's ``details.flags``. A run being compensated is 409: its unwind decides.
    Closing a flagged run's item leaves a succeeded (or running) run as it is."""
    reason = reason_required(reason)
    # The item before the run: the order unwind_start takes them in (claim, then the run's lock).
    existing = (
        RecoveryItem.objects.select_for_update()
        .filter(run_id=run.pk, status__in=RecoveryItem.UNRESOLVED)
        .first()
    )
    run = Run.objects.select_for_update().select_related("tenant").get(pk=run.pk)
    if run.status in decisions.NOT_FLAGGABLE:
        raise errors.InvalidTransition(
            run,
            to="flagged",
            current=run.status,
            message=f"Run {run.pk} is being compensated; its unwind decides what happens next. "
            "Flag it once the unwind has finished.",
        )
    flag = {"by": actor.label, "reason": reason, "at": timezone.now().isoformat(), "run_status": run.status}
    item = items.item_open_or_update(
        run=run,
        reason=existing.reason if existing is not None else RecoveryItem.Reason.MANUAL,
        actor=actor,
        error="" if existing is not None else f"Flagged for review by {actor.label}: {reason}",
        details={"flags": [*(existing.details.get("flags", []) if existing is not None else []), flag]},
    )
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind="run.flagged",
        subject=run,
        from_state=run.status,
        to_state=run.status,
        reason=reason,
        data={"item_id": item.pk, "item_reason": item.reason, "updated": existing is not None},
    )
    return item


@_audits_refusals("retry_step")
def step_retry(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    return unwinds.step_retry(step=step, actor=actor, reason=reason)


@_audits_refusals("skip_step")
def step_skip(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    return unwinds.step_skip(step=step, actor=actor, reason=reason)


@_audits_refusals("stop_unwind")
def unwind_stop(*, unwind: Unwind, actor: Actor, reason: str) -> Unwind:
    """Stop a running unwind between steps; its item goes back to the queue
    (``recovery.unwinds.unwind_stop``)."""
    return unwinds.unwind_stop(unwind=unwind, actor=actor, reason=reason)


@dataclass(frozen=True)
class BulkOutcome:
    item_id: str
    ok: bool
    code: str = ""
    message: str = ""
    unwind_id: str | None = None
    sentence: str = ""  # the refusal as a person reads it (recovery.decisions); not in as_dict

    def as_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "ok": self.ok,
            "code": self.code,
            "message": self.message,
            "unwind_id": self.unwind_id,
        }


def _bulk(
    chosen_items: Iterable[RecoveryItem],
    *,
    reason: str,
    what: str,
    apply: Callable[[RecoveryItem, str], object],
) -> list[BulkOutcome]:
    """One decision per item (``apply(item, reason)``), each in its own transaction: one refusal
    does not undo the others. Only low-risk items qualify: anything riskier deserves a look of its
    own."""
    reason = reason_required(reason)
    chosen = list(chosen_items)
    cap = saga().bulk_max_items
    if len(chosen) > cap:
        raise errors.ValidationFailed(
            f"At most {cap} items can be handled at once; {len(chosen)} were selected.",
            details={"max_items": cap, "selected": len(chosen)},
        )
    outcomes: list[BulkOutcome] = []
    for item in chosen:
        if item.risk != Risk.LOW:
            outcomes.append(
                BulkOutcome(
                    item.pk,
                    False,
                    "risk_too_high",
                    f"Bulk {what} is for low-risk items only; {item.pk} is {item.risk} risk.",
                )
            )
            continue
        try:
            with transaction.atomic():
                result = apply(item, reason)
        except errors.SagaError as exc:
            outcomes.append(
                BulkOutcome(item.pk, False, exc.code, exc.message, sentence=decisions.refusal_sentence(exc))
            )
            continue
        outcomes.append(
            BulkOutcome(item.pk, True, unwind_id=result.pk if isinstance(result, Unwind) else None)
        )
    return outcomes


def items_bulk_close(*, items: Iterable[RecoveryItem], actor: Actor, reason: str) -> list[BulkOutcome]:
    return _bulk(
        items,
        reason=reason,
        what="close",
        apply=lambda item, reason: item_close(item=item, actor=actor, reason=reason),
    )


def items_bulk_compensate(*, items: Iterable[RecoveryItem], actor: Actor, reason: str) -> list[BulkOutcome]:
    return _bulk(
        items,
        reason=reason,
        what="compensate",
        apply=lambda item, reason: unwind_start(item=item, actor=actor, reason=reason),
    )


# --- Cancel ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CancelOutcome:
    run: Run
    command: AgentCommand
    unknown: list[Action]  # the actions that were running and now have an unknown outcome
    item: RecoveryItem | None  # None: the run changed nothing, so there is nothing to decide


@_audits_refusals("cancel")
@transaction.atomic
def run_cancel(*, run: Run, actor: Actor, reason: str) -> CancelOutcome:
    """An operator cancels a run (the user withdrew the request, the agent misbehaves): running or
    failed → cancelled, in one transaction with everything that follows from it.

    - The actions it still had ``running`` become ``unknown`` (the agent can no longer report
      them): someone confirms whether each happened before anything is undone.
    - The agent's next write is refused (409 ``run_not_accepting_actions``) and a ``cancel``
      command waits for it (heartbeat, GET commands; pushed signed to its ``resume_url``).
    - When the run changed something (succeeded or unknown actions) it goes to the recovery queue
      with reason ``cancelled``, so a person decides whether to undo it; an unresolved item of the
      run is updated rather than duplicated (and so is one without anything to decide).

    A run that is not running or failed is refused (409 ``invalid_transition`` with its state)."""
    reason = reason_required(reason)
    # The item before the run: the order the other decisions take them in (unwind_start, close,
    # flag), so a cancel racing one of them waits for it instead of deadlocking.
    list(RecoveryItem.objects.select_for_update().filter(run_id=run.pk, status__in=RecoveryItem.UNRESOLVED))
    run = runs.run_lock(run)
    # What the confirmation showed, read again under the run's lock: neither the agent nor another
    # operator can start or finish an action of the run until this transaction ends.
    preview = selectors.cancel_preview(run=run)
    runs.run_cancel(run=run, actor=actor, reason=reason)
    moved = list(Action.objects.filter(pk__in=[a.pk for a in preview.running]).order_by("seq"))
    item = None
    if preview.queues:
        item = items.item_open_or_update(
            run=run,
            reason=RecoveryItem.Reason.CANCELLED,
            actor=actor,
            failed_action=moved[-1] if moved else None,
            error=f"Cancelled by {actor.label}: {reason}",
            details={
                "cancel": {
                    "by": actor.label,
                    "reason": reason,
                    "unknown_action_ids": [a.pk for a in [*preview.unknown, *moved]],
                    "changed_action_ids": [a.pk for a in preview.changed],
                }
            },
        )
    # The cancel supersedes a resume the agent has not acknowledged yet: it gets only the cancel.
    commands.commands_cancel_pending(run=run, actor=actor, reason="The run was cancelled.")
    command = commands.command_issue(run=run, kind=AgentCommand.Kind.CANCEL, actor=actor, reason=reason)
    return CancelOutcome(run=run, command=command, unknown=moved, item=item)


# --- Periodic duties -------------------------------------------------------------------------


def runs_fail_lost_agents(*, now: datetime | None = None) -> int:
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
                error=f"No heartbeat for {since} (threshold "
                f"{saga().heartbeat_timeout_s}s): the agent is presumed lost.",
            )
            failed += 1
    return failed
