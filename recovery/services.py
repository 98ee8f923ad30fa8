"""Every decision about a run: recovery items, approvals, agent commands (and, in the engine
modules, unwinds). The dashboard and the API both call these; neither re-implements a rule.

Each function checks state in the database (compare-and-set or a row lock), writes its audit
event in the same transaction, and defers side effects (jobs, notifications) to on_commit.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import structlog
from django.conf import settings
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ledger import errors
from ledger import services as ledger
from ledger.audit import Actor, audit_record
from ledger.hashing import sha256_hex
from ledger.models import RISK_ORDER, Action, ActionClass, Checkpoint, Membership, Risk, Run, max_risk
from ledger.policies import policy_settings_for
from ledger.services import RecordedAction
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
    subject = kwargs.get("item") or kwargs.get("approval") or kwargs.get("step")
    if subject is None:
        return
    run_id = getattr(subject, "run_id", None) or subject.unwind.run_id
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


# --- Recovery items ------------------------------------------------------------------------

# Statuses whose effects are (or may be) still in the world and so count towards an item's risk.
_LIVE_ACTION_STATUSES = (
    Action.Status.RUNNING,
    Action.Status.SUCCEEDED,
    Action.Status.UNKNOWN,
    Action.Status.COMPENSATING,
    Action.Status.COMPENSATION_FAILED,
)


def error_signature(*, tool: str, error: str) -> str:
    """Groups similar failures: the tool plus the error with ids, numbers and quoted values
    blanked, so "timeout after 30s for user 17" and "… 45s … 18" group together."""
    normalised = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", error.lower())
    normalised = re.sub(r"\b[0-9a-f]{8,}\b|\d+", "#", normalised)
    normalised = re.sub(r"\s+", " ", normalised).strip()[:200]
    return sha256_hex(f"{tool}|{normalised}")[:16]


def search_text_for(*, tool: str, request: str) -> str:
    """What the queue's search finds an item by, besides exact ids: part of the failing tool or
    of the run's request (case-insensitive)."""
    return f"{tool}\n{request}".lower()


def item_search_text(*, run: Run, failed_action: Action | None) -> str:
    return search_text_for(tool=failed_action.tool if failed_action is not None else "", request=run.request)


def _item_risk(run: Run, failed_action: Action | None) -> str:
    risks = list(
        Action.objects.filter(run=run, status__in=_LIVE_ACTION_STATUSES).values_list("risk", flat=True)
    )
    if failed_action is not None:
        risks.append(failed_action.risk)
    return max_risk(*risks)


def suggest_resolution(*, run: Run, failed_action: Action | None = None) -> str:
    """What an operator most likely wants, from the latest checkpoint's recovery mode and what the
    run changed. A suggestion only; the operator decides."""
    actions = list(Action.objects.filter(run=run).only("status", "action_class", "retryable"))
    if any(a.status == Action.Status.UNKNOWN for a in actions):
        return RecoveryItem.Suggestion.RECONCILE
    checkpoint = Checkpoint.objects.filter(run=run).order_by("-created_at", "-id").first()
    if checkpoint is not None and checkpoint.recovery_mode == Checkpoint.RecoveryMode.COMPENSATE_ONLY:
        return RecoveryItem.Suggestion.COMPENSATE
    if checkpoint is not None and checkpoint.recovery_mode == Checkpoint.RecoveryMode.RESUME_ONLY:
        return RecoveryItem.Suggestion.RESUME
    undoable = [
        a for a in actions if a.status == Action.Status.SUCCEEDED and a.action_class != ActionClass.READ_ONLY
    ]
    if failed_action is not None and failed_action.retryable:
        return RecoveryItem.Suggestion.RESUME
    if undoable:
        return RecoveryItem.Suggestion.COMPENSATE
    return RecoveryItem.Suggestion.CLOSE


def _on_item_opened(item: RecoveryItem) -> None:
    """After commit: tell people. Notifications are sent by a job, never inside the request."""
    from recovery import notifications

    transaction.on_commit(lambda: notifications.enqueue_item_opened(item_id=item.pk))


@transaction.atomic
def item_open_or_update(
    *,
    run: Run,
    reason: str,
    actor: Actor,
    failed_action: Action | None = None,
    error: str = "",
    details: dict[str, Any] | None = None,
) -> RecoveryItem:
    """Put a run in the recovery queue: one unresolved item per run, updated rather than
    duplicated when the run fails again in another way."""
    if reason not in RecoveryItem.Reason.values:
        raise errors.ValidationFailed(f"Unknown recovery reason {reason!r}.", details={"reason": reason})
    error = error or run.error
    risk = _item_risk(run, failed_action)
    suggestion = suggest_resolution(run=run, failed_action=failed_action)
    tool = failed_action.tool if failed_action is not None else ""
    signature = error_signature(tool=tool, error=error) if (tool or error) else ""
    existing = (
        RecoveryItem.objects.select_for_update()
        .filter(run=run)
        .exclude(status=RecoveryItem.Status.RESOLVED)
        .first()
    )
    if existing is None:
        try:
            with transaction.atomic():
                item = RecoveryItem.objects.create(
                    tenant_id=run.tenant_id,
                    run=run,
                    reason=reason,
                    failed_action=failed_action,
                    risk=risk,
                    suggested_resolution=suggestion,
                    error=error,
                    signature=signature,
                    search_text=item_search_text(run=run, failed_action=failed_action),
                    details=details or {},
                )
        except IntegrityError:
            # Another transaction opened the run's item a moment ago: update that one instead.
            existing = RecoveryItem.objects.select_for_update().get(run=run, status__in=["open", "claimed"])
        else:
            audit_record(
                tenant=run.tenant,
                run=run,
                actor=actor,
                kind="recovery.opened",
                subject=item,
                to_state=item.status,
                reason=error,
                data={"reason": reason, "risk": risk},
            )
            _on_item_opened(item)
            return item
    # A generic "failed" report (the agent giving up) must not hide the specific reason the run
    # is already queued for (an unknown outcome, a verification mismatch, a lost agent).
    if not (reason == RecoveryItem.Reason.FAILED and existing.reason != RecoveryItem.Reason.MANUAL):
        existing.reason = reason
    existing.failed_action = failed_action or existing.failed_action
    existing.risk = max_risk(existing.risk, risk)
    existing.suggested_resolution = suggestion
    existing.error = error or existing.error
    existing.signature = signature or existing.signature
    existing.search_text = item_search_text(run=run, failed_action=existing.failed_action)
    existing.details = {**existing.details, **(details or {})}
    existing.save(
        update_fields=[
            "reason",
            "failed_action",
            "risk",
            "suggested_resolution",
            "error",
            "signature",
            "search_text",
            "details",
            "updated_at",
        ]
    )
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind="recovery.updated",
        subject=existing,
        reason=error,
        data={"reason": reason, "risk": existing.risk},
    )
    return existing


@dataclass(frozen=True)
class FailOutcome:
    run: Run
    item: RecoveryItem | None
    unwind: Any = None  # recovery.models.Unwind when the failure was auto-compensated


@transaction.atomic
def run_fail_and_queue(
    *, run: Run, actor: Actor, error: str, reason: str = "failed", failed_action: Action | None = None
) -> FailOutcome:
    """The agent reports its run failed: record it and put the run in the recovery queue."""
    item_reason = reason if reason in RecoveryItem.Reason.values else RecoveryItem.Reason.FAILED
    ledger.run_fail(run=run, actor=actor, error=error, reason=item_reason, failed_action=failed_action)
    item = item_open_or_update(
        run=run, reason=item_reason, actor=actor, failed_action=failed_action, error=error
    )
    unwind = _auto_compensate(run=run, item=item)
    if unwind is not None:
        item.refresh_from_db()
    return FailOutcome(run=run, item=item, unwind=unwind)


@transaction.atomic
def action_fail_and_queue(
    *, action: Action, actor: Actor, error: str, retryable: bool, layer: str, outcome_unknown: bool = False
) -> Action:
    """An action failed; a timed-out call whose outcome is unknown also queues the run, because a
    human (or a reader) must confirm whether it happened before anything resumes or undoes it."""
    ledger.action_fail(
        action=action,
        actor=actor,
        error=error,
        retryable=retryable,
        layer=layer,
        outcome_unknown=outcome_unknown,
    )
    if outcome_unknown:
        item_open_or_update(
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
    ledger.action_verify(action=action, actor=actor, ok=ok, expected=expected, actual=actual, reason=reason)
    if ok:
        return action, None
    run = Run.objects.select_for_update().get(pk=action.run_id)
    message = reason or "verification failed: the action's effect is not what was expected"
    if run.status in (Run.Status.RUNNING, Run.Status.SUCCEEDED):
        ledger.run_fail(
            run=run,
            actor=actor,
            error=message,
            reason=RecoveryItem.Reason.VERIFICATION_FAILED,
            failed_action=action,
        )
    item = item_open_or_update(
        run=run,
        reason=RecoveryItem.Reason.VERIFICATION_FAILED,
        actor=actor,
        failed_action=action,
        error=message,
        details={"verification": {"expected": expected, "actual": actual}},
    )
    return action, item


# --- Approvals -----------------------------------------------------------------------------


def approval_expiry_from(now: Any = None) -> Any:
    return (now or timezone.now()) + timedelta(hours=settings.SAGA["APPROVAL_EXPIRY_H"])


def _on_approval_requested(approval: Approval) -> None:
    from recovery import notifications

    transaction.on_commit(lambda: notifications.enqueue_approval_requested(approval_id=approval.pk))


@transaction.atomic
def action_record_gated(*, run: Run, actor: Actor, **fields: Any) -> RecordedAction:
    """Record an action (ledger.action_record, idempotent) and, when its policy demands a human,
    move it to awaiting_approval and open the approval bound to the exact args."""
    recorded = ledger.action_record(run=run, actor=actor, **fields)
    action = recorded.action
    if recorded.created and action.requires_approval:
        # The run as the ledger just locked and read it. The caller's may be a bare reference by
        # id, whose empty audit chain head would send every approval event down the audit's
        # re-read-and-relink path (correct, but three statements instead of one).
        run = action.run
        ledger.action_await_approval(action=action, actor=actor)
        approval = Approval.objects.create(
            tenant_id=run.tenant_id,
            run=run,
            kind=Approval.Kind.ACTION,
            action=action,
            risk=action.risk,
            tool=action.tool,
            args=action.args,
            args_hash=sha256_hex(action.args),
            requested_by_key=actor.key,
            requested_by=actor.user,
            expires_at=approval_expiry_from(),
        )
        audit_record(
            tenant=run.tenant,
            run=run,
            actor=actor,
            kind="approval.requested",
            subject=approval,
            to_state=approval.status,
            data={"tool": action.tool, "risk": action.risk, "args_hash": approval.args_hash},
        )
        _on_approval_requested(approval)
    return recorded


def _is_requester(approval: Approval, actor: Actor) -> bool:
    if actor.user is not None and approval.requested_by_id == actor.user.pk:
        return True
    return actor.key is not None and approval.requested_by_key_id == actor.key.pk


def _decide(approval: Approval, *, to: str, actor: Actor, reason: str, updates: dict[str, Any]) -> Approval:
    """Compare-and-set pending → to, refusing an expired approval (and recording the expiry)."""
    if not reason.strip():
        raise errors.ValidationFailed(
            "A reason is required for an approval decision.", details={"reason": "required"}
        )
    current = Approval.objects.select_for_update().get(pk=approval.pk)
    if current.status != Approval.Status.PENDING:
        raise errors.InvalidTransition(current, to=to, current=current.status)
    if current.expires_at <= timezone.now():
        raise errors.ApprovalExpired(
            f"Approval {approval.pk} expired at {current.expires_at.isoformat()}.",
            details={"approval_id": approval.pk, "current": Approval.Status.EXPIRED},
        )
    if to == Approval.Status.APPROVED and current.risk == "critical" and _is_requester(current, actor):
        raise errors.FourEyesRequired(
            "Critical-risk approvals need a second person: whoever asked for this cannot approve it.",
            details={"approval_id": approval.pk},
        )
    fields = {
        "status": to,
        "decided_at": timezone.now(),
        "reason": reason,
        "decided_by": actor.user,
        "decided_by_key": actor.key,
        **updates,
    }
    for name, value in fields.items():
        setattr(current, name, value)
    current.save(update_fields=list(fields))
    return current


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
        from recovery import unwinds

        unwinds.step_approval_decided(approval=decided, actor=actor)
    elif decided.status == Approval.Status.APPROVED:
        ledger.action_approve(action=decided.action, actor=actor, reason=reason, args=edited_args)
    else:
        ledger.action_reject(action=decided.action, actor=actor, reason=reason)


@_audits_refusals("approve")
@transaction.atomic
def approval_approve(
    *, approval: Approval, actor: Actor, reason: str, args: Any = None, shown_args_hash: str | None = None
) -> Approval:
    """Approve exactly what was shown. ``shown_args_hash`` (what the approver's screen showed)
    must still match; edited ``args`` replace the action's args and both versions are audited."""
    if shown_args_hash is not None and shown_args_hash != approval.args_hash:
        raise errors.Conflict(
            "The arguments changed since they were shown to you; review them again.",
            details={"approval_id": approval.pk, "args_hash": approval.args_hash},
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
    decided = _decide(approval, to=Approval.Status.APPROVED, actor=actor, reason=reason, updates=updates)
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
    decided = _decide(approval, to=Approval.Status.REJECTED, actor=actor, reason=reason, updates={})
    _settle(decided, actor=actor, reason=reason)
    return decided


def approvals_expire_due(*, now: Any = None) -> int:
    """Expire pending approvals past their deadline (a periodic job). The gated action becomes
    rejected, so an agent polling it sees ``expired`` and start() refuses."""
    now = now or timezone.now()
    expired = 0
    for approval_id in Approval.objects.filter(
        status=Approval.Status.PENDING, expires_at__lte=now
    ).values_list("pk", flat=True):
        with transaction.atomic():
            approval = (
                Approval.objects.select_for_update(skip_locked=True)
                .filter(pk=approval_id, status=Approval.Status.PENDING)
                .select_related("run__tenant", "action")
                .first()
            )
            if approval is None:
                continue
            approval.status = Approval.Status.EXPIRED
            approval.decided_at = now
            approval.reason = "expired without a decision"
            approval.save(update_fields=["status", "decided_at", "reason"])
            _settle(approval, actor=Actor.system("approval-expiry"), reason="approval expired")
            expired += 1
    return expired


# --- Agent commands ------------------------------------------------------------------------


def commands_pending(*, run: Run) -> QuerySet[AgentCommand]:
    return AgentCommand.objects.filter(run=run, status=AgentCommand.Status.PENDING).select_related(
        "checkpoint"
    )


@transaction.atomic
def command_issue(
    *, run: Run, kind: str, actor: Actor, reason: str, checkpoint: Checkpoint | None = None
) -> AgentCommand:
    """Queue a resume/cancel command for the agent: it is pulled (GET commands, heartbeat) and,
    when the run has a resume_url, pushed there by a job after commit."""
    if kind not in AgentCommand.Kind.values:
        raise errors.ValidationFailed(f"Unknown command kind {kind!r}.", details={"kind": kind})
    command = AgentCommand.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        kind=kind,
        checkpoint=checkpoint,
        reason=reason,
        created_by=actor.user,
    )
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind=f"command.{kind}",
        subject=command,
        reason=reason,
        to_state=command.status,
        data={"checkpoint": getattr(checkpoint, "pk", None)},
    )
    if run.resume_url:
        from recovery import notifications

        transaction.on_commit(lambda: notifications.enqueue_command_delivery(command_id=command.pk))
    return command


@transaction.atomic
def command_ack(*, command: AgentCommand, actor: Actor) -> AgentCommand:
    """pending → acked. Acknowledging twice is harmless (agents retry)."""
    updated = AgentCommand.objects.filter(pk=command.pk, status=AgentCommand.Status.PENDING).update(
        status=AgentCommand.Status.ACKED, acked_at=timezone.now()
    )
    command.refresh_from_db()
    if updated:
        audit_record(
            tenant=command.run.tenant,
            run=command.run,
            actor=actor,
            kind="command.acked",
            subject=command,
            from_state=AgentCommand.Status.PENDING,
            to_state=AgentCommand.Status.ACKED,
        )
    return command


# --- Unwinds, resume and close (the operator's decisions) -----------------------------------

AUTO_COMPENSATOR = Actor.system("auto-compensate")
MAX_COMMAND_DELIVERY_ATTEMPTS = 10


def _require_reason(reason: str, what: str) -> None:
    if not reason.strip():
        raise errors.ValidationFailed(f"A reason is required to {what}.", details={"reason": "required"})


def notify_approval_requested(approval: Approval) -> None:
    """After commit: tell approvers (used by the unwind engine for compensation steps)."""
    _on_approval_requested(approval)


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


@transaction.atomic
def item_claim(*, item: RecoveryItem, actor: Actor, reason: str = "") -> RecoveryItem:
    """open → claimed (compare-and-set): a second click, tab or operator loses cleanly."""
    now = timezone.now()
    if (
        RecoveryItem.objects.filter(pk=item.pk, status=RecoveryItem.Status.OPEN).update(
            status=RecoveryItem.Status.CLAIMED, claimed_by=actor.user, claimed_at=now, updated_at=now
        )
        != 1
    ):
        current = RecoveryItem.objects.filter(pk=item.pk).values_list("status", flat=True).first()
        raise errors.InvalidTransition(item, to=RecoveryItem.Status.CLAIMED, current=current)
    item.status, item.claimed_by, item.claimed_at = RecoveryItem.Status.CLAIMED, actor.user, now
    audit_record(
        tenant=item.run.tenant,
        run=item.run,
        actor=actor,
        kind="recovery.claimed",
        subject=item,
        from_state=RecoveryItem.Status.OPEN,
        to_state=RecoveryItem.Status.CLAIMED,
        reason=reason,
    )
    return item


def _item_resolve(
    *,
    item: RecoveryItem,
    actor: Actor,
    resolution: str,
    note: str,
    allowed_from: tuple[str, ...],
    details: dict[str, Any] | None = None,
    resolved_by: Any = None,
) -> RecoveryItem:
    now = timezone.now()
    fields: dict[str, Any] = {
        "status": RecoveryItem.Status.RESOLVED,
        "resolution": resolution,
        "resolution_note": note,
        "resolved_at": now,
        "updated_at": now,
        "resolved_by": resolved_by if resolved_by is not None else actor.user,
    }
    if details is not None:
        fields["details"] = {**item.details, **details}
    previous = RecoveryItem.objects.filter(pk=item.pk).values_list("status", flat=True).first()
    if (
        previous not in allowed_from
        or RecoveryItem.objects.filter(pk=item.pk, status=previous).update(**fields) != 1
    ):
        current = RecoveryItem.objects.filter(pk=item.pk).values_list("status", flat=True).first()
        raise errors.InvalidTransition(item, to=RecoveryItem.Status.RESOLVED, current=current)
    for name, value in fields.items():
        setattr(item, name, value)
    audit_record(
        tenant=item.run.tenant,
        run=item.run,
        actor=actor,
        kind="recovery.resolved",
        subject=item,
        from_state=previous,
        to_state=RecoveryItem.Status.RESOLVED,
        reason=note,
        data={"resolution": resolution},
    )
    return item


@_audits_refusals("compensate")
@transaction.atomic
def unwind_start(*, item: RecoveryItem, actor: Actor, reason: str, automatic: bool = False) -> Unwind:
    """Compensate the item's run: claim the item, move the run to compensating, freeze the plan
    into persisted steps and, after commit, hand the first step to a worker. Two concurrent calls
    produce one unwind; the loser gets InvalidTransition with the item's current state."""
    from recovery import unwinds

    _require_reason(reason, "compensate")
    item = RecoveryItem.objects.select_related("run__tenant").get(pk=item.pk)
    item_claim(item=item, actor=actor, reason=reason)
    run = Run.objects.select_for_update().select_related("tenant").get(pk=item.run_id)
    plan = compensation_plan(run=run)
    _refuse_unknown_outcomes(plan, doing="compensate")
    ledger.run_compensation_started(run=run, actor=actor, reason=reason)
    return unwinds.unwind_create(
        run=run, item=item, plan=plan, actor=actor, reason=reason, automatic=automatic
    )


def _auto_compensate(*, run: Run, item: RecoveryItem) -> Unwind | None:
    """Unwind without a human when every live action is at or under the policy's
    ``auto_compensate.max_risk`` and there is something to undo (and nothing unknown)."""
    max_allowed = policy_settings_for(run.tenant).auto_compensate.get("max_risk")
    if not max_allowed:
        return None
    threshold = (
        RISK_ORDER.get(Risk(str(max_allowed).lower()), -1) if str(max_allowed).lower() in Risk.values else -1
    )
    live = list(Action.objects.filter(run=run, status__in=_LIVE_ACTION_STATUSES))
    if not live or any(a.status == Action.Status.UNKNOWN for a in live):
        return None
    if any(RISK_ORDER[Risk(a.risk)] > threshold for a in live):
        return None
    if not any(step.can_undo for step in compensation_plan(run=run).steps):
        return None
    return unwind_start(
        item=item,
        actor=AUTO_COMPENSATOR,
        automatic=True,
        reason=f"auto-compensation: every action is at or under {max_allowed} risk",
    )


def item_resolve_compensated(*, unwind: Unwind, not_undone: list[dict[str, Any]]) -> RecoveryItem | None:
    """The unwind settled every step: resolve its item as compensated (or auto_compensated)."""
    item = (
        RecoveryItem.objects.filter(run_id=unwind.run_id)
        .exclude(status=RecoveryItem.Status.RESOLVED)
        .select_related("run__tenant")
        .first()
    )
    if item is None:
        return None
    resolution = (
        RecoveryItem.Resolution.AUTO_COMPENSATED if unwind.automatic else RecoveryItem.Resolution.COMPENSATED
    )
    note = unwind.reason
    if not_undone:
        note += " (left as is: " + ", ".join(entry["action_tool"] for entry in not_undone) + ")"
    return _item_resolve(
        item=item,
        actor=Actor.system("unwind-engine"),
        resolution=resolution,
        note=note,
        allowed_from=(RecoveryItem.Status.CLAIMED, RecoveryItem.Status.OPEN),
        details={"unwind_id": unwind.pk, "left": [], "not_undone": not_undone},
        resolved_by=unwind.requested_by,
    )


def item_reopen_after_unwind(
    *, unwind: Unwind, run: Run, reason: str, error: str, left: list[dict[str, Any]]
) -> RecoveryItem:
    """The unwind ended with steps left: the item goes back to the queue (open), naming them."""
    engine = Actor.system("unwind-engine")
    item = (
        RecoveryItem.objects.select_for_update()
        .filter(run=run)
        .exclude(status=RecoveryItem.Status.RESOLVED)
        .first()
    )
    if item is not None and item.status == RecoveryItem.Status.CLAIMED:
        RecoveryItem.objects.filter(pk=item.pk, status=RecoveryItem.Status.CLAIMED).update(
            status=RecoveryItem.Status.OPEN,
            claimed_by=None,
            claimed_at=None,
            reopened_count=item.reopened_count + 1,
            updated_at=timezone.now(),
        )
        audit_record(
            tenant=run.tenant,
            run=run,
            actor=engine,
            kind="recovery.reopened",
            subject=item,
            from_state=RecoveryItem.Status.CLAIMED,
            to_state=RecoveryItem.Status.OPEN,
            reason=error,
            data={"reason": reason, "unwind_id": unwind.pk},
        )
        _on_item_opened(item)
    return item_open_or_update(
        run=run, reason=reason, actor=engine, error=error, details={"unwind_id": unwind.pk, "left": left}
    )


@dataclass
class ResumePreview:
    run: Run
    checkpoint: Checkpoint | None
    succeeded_after: list[Action]
    repeats: list[Action]
    unknown: list[Action]
    warnings: list[dict[str, Any]]

    @property
    def stale(self) -> bool:
        return bool(self.succeeded_after)

    def as_dict(self) -> dict[str, Any]:
        def brief(action: Action) -> dict[str, Any]:
            return {
                "id": action.pk,
                "tool": action.tool,
                "seq": action.seq,
                "status": action.status,
                "action_class": action.action_class,
                "completion_seq": action.completion_seq,
            }

        return {
            "run_id": self.run.pk,
            "checkpoint_id": getattr(self.checkpoint, "pk", None),
            "checkpoint_name": getattr(self.checkpoint, "name", None),
            "stale": self.stale,
            "succeeded_after": [brief(a) for a in self.succeeded_after],
            "repeats": [brief(a) for a in self.repeats],
            "unknown": [brief(a) for a in self.unknown],
            "warnings": self.warnings,
        }


def _checkpoint_for(run: Run, checkpoint: Checkpoint | None) -> Checkpoint | None:
    if checkpoint is None:
        return Checkpoint.objects.filter(run=run).order_by("-created_at", "-id").first()
    if checkpoint.run_id != run.pk:
        raise errors.ValidationFailed(
            "The checkpoint does not belong to this run.", details={"checkpoint_id": checkpoint.pk}
        )
    return checkpoint


def resume_preview(*, item: RecoveryItem, checkpoint: Checkpoint | None = None) -> ResumePreview:
    """What a resume from ``checkpoint`` (default: the latest) would mean. A checkpoint is stale
    when actions succeeded after it was written (its ``completion_mark``): the agent, restarting
    there, would do them again; the irreversible ones among them would happen twice."""
    run = item.run
    chosen = _checkpoint_for(run, checkpoint)
    actions = list(Action.objects.filter(run=run).order_by("seq"))
    mark = chosen.completion_mark if chosen is not None else 0
    after = sorted(
        (a for a in actions if a.completion_seq is not None and a.completion_seq > mark),
        key=lambda a: a.completion_seq or 0,
    )
    repeats = [a for a in after if a.action_class == ActionClass.EXTERNAL_IRREVERSIBLE]
    unknown = [a for a in actions if a.status == Action.Status.UNKNOWN]
    warnings: list[dict[str, Any]] = []
    if chosen is None:
        warnings.append(
            {
                "code": "no_checkpoint",
                "message": "The run wrote no checkpoint: a resume restarts it from the beginning.",
            }
        )
    if after:
        warnings.append(
            {
                "code": "stale_checkpoint",
                "message": (
                    f"{len(after)} action(s) succeeded after checkpoint "
                    f"{getattr(chosen, 'name', '(start)')!s}: "
                    + ", ".join(a.tool for a in after)
                    + ". Resuming there repeats them."
                ),
                "action_ids": [a.pk for a in after],
            }
        )
    if repeats:
        warnings.append(
            {
                "code": "repeats_non_idempotent",
                "message": "A resume would repeat irreversible actions: "
                + ", ".join(a.tool for a in repeats)
                + ".",
                "action_ids": [a.pk for a in repeats],
            }
        )
    if unknown:
        warnings.append(
            {
                "code": "outcome_unknown",
                "message": "Reconcile unknown outcomes before resuming: "
                + ", ".join(a.tool for a in unknown)
                + ".",
                "action_ids": [a.pk for a in unknown],
            }
        )
    if chosen is not None and chosen.recovery_mode == Checkpoint.RecoveryMode.COMPENSATE_ONLY:
        warnings.append(
            {
                "code": "resume_not_allowed",
                "message": f"Checkpoint {chosen.name} says compensate only: the agent cannot resume here.",
            }
        )
    return ResumePreview(
        run=run, checkpoint=chosen, succeeded_after=after, repeats=repeats, unknown=unknown, warnings=warnings
    )


@_audits_refusals("resume")
@transaction.atomic
def item_resume(
    *, item: RecoveryItem, actor: Actor, reason: str, checkpoint: Checkpoint | None = None
) -> AgentCommand:
    """Resolve the item as resumed, put the run back to running and queue a resume command for
    the agent (pulled on heartbeat, pushed to resume_url when set)."""
    _require_reason(reason, "resume")
    item = RecoveryItem.objects.select_related("run__tenant").get(pk=item.pk)
    preview = resume_preview(item=item, checkpoint=checkpoint)
    _refuse_unknown_outcomes(preview.unknown, doing="resume")
    if (
        preview.checkpoint is not None
        and preview.checkpoint.recovery_mode == Checkpoint.RecoveryMode.COMPENSATE_ONLY
    ):
        raise errors.Conflict(
            f"Checkpoint {preview.checkpoint.name} allows compensation only.",
            details={"checkpoint_id": preview.checkpoint.pk},
            code="resume_not_allowed",
        )
    _item_resolve(
        item=item,
        actor=actor,
        resolution=RecoveryItem.Resolution.RESUMED,
        note=reason,
        allowed_from=(RecoveryItem.Status.OPEN,),
        details={
            "resume": {
                "checkpoint_id": getattr(preview.checkpoint, "pk", None),
                "warnings": [w["code"] for w in preview.warnings],
            }
        },
    )
    run = Run.objects.select_for_update().select_related("tenant").get(pk=item.run_id)
    ledger.run_resume(run=run, actor=actor, reason=reason)
    return command_issue(
        run=run, kind=AgentCommand.Kind.RESUME, actor=actor, reason=reason, checkpoint=preview.checkpoint
    )


@_audits_refusals("close")
@transaction.atomic
def item_close(*, item: RecoveryItem, actor: Actor, reason: str) -> RecoveryItem:
    """Resolve the item as closed (a reason is required); a failed or cancelled run is closed too."""
    _require_reason(reason, "close")
    item = RecoveryItem.objects.select_related("run__tenant").get(pk=item.pk)
    _item_resolve(
        item=item,
        actor=actor,
        resolution=RecoveryItem.Resolution.CLOSED,
        note=reason,
        allowed_from=(RecoveryItem.Status.OPEN,),
    )
    run = Run.objects.select_for_update().select_related("tenant").get(pk=item.run_id)
    if run.status in (Run.Status.FAILED, Run.Status.CANCELLED):
        ledger.run_close(run=run, actor=actor, reason=reason)
    return item


@transaction.atomic
def item_assign(*, item: RecoveryItem, actor: Actor, assignee: Any) -> RecoveryItem:
    """Assign (or, with None, unassign) an item to a member of its tenant. Not a state change."""
    if (
        assignee is not None
        and not Membership.objects.filter(user=assignee, tenant_id=item.tenant_id).exists()
    ):
        raise errors.ValidationFailed(
            "The assignee is not a member of this tenant.",
            details={"assignee": getattr(assignee, "pk", None)},
        )
    RecoveryItem.objects.filter(pk=item.pk).update(assignee=assignee, updated_at=timezone.now())
    item.assignee = assignee
    audit_record(
        tenant=item.run.tenant,
        run=item.run,
        actor=actor,
        kind="recovery.assigned",
        subject=item,
        data={
            "assignee": getattr(assignee, "pk", None),
            "assignee_label": assignee.get_username() if assignee is not None else "",
        },
    )
    return item


@_audits_refusals("retry_step")
def step_retry(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    from recovery import unwinds

    return unwinds.step_retry(step=step, actor=actor, reason=reason)


@_audits_refusals("skip_step")
def step_skip(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    from recovery import unwinds

    return unwinds.step_skip(step=step, actor=actor, reason=reason)


@dataclass(frozen=True)
class BulkOutcome:
    item_id: str
    ok: bool
    code: str = ""
    message: str = ""
    unwind_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "ok": self.ok,
            "code": self.code,
            "message": self.message,
            "unwind_id": self.unwind_id,
        }


def _bulk(items: Any, *, reason: str, what: str, apply: Any) -> list[BulkOutcome]:
    """One decision per item, each in its own transaction: one refusal does not undo the others.
    Only low-risk items qualify: anything riskier deserves a look of its own."""
    _require_reason(reason, what)
    chosen = list(items)
    cap = int(settings.SAGA["BULK_MAX_ITEMS"])
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
                result = apply(item)
        except errors.SagaError as exc:
            outcomes.append(BulkOutcome(item.pk, False, exc.code, exc.message))
            continue
        outcomes.append(
            BulkOutcome(
                item.pk, True, unwind_id=getattr(result, "pk", None) if isinstance(result, Unwind) else None
            )
        )
    return outcomes


def items_bulk_close(*, items: Any, actor: Actor, reason: str) -> list[BulkOutcome]:
    return _bulk(
        items,
        reason=reason,
        what="close",
        apply=lambda item: item_close(item=item, actor=actor, reason=reason),
    )


def items_bulk_compensate(*, items: Any, actor: Actor, reason: str) -> list[BulkOutcome]:
    return _bulk(
        items,
        reason=reason,
        what="compensate",
        apply=lambda item: unwind_start(item=item, actor=actor, reason=reason),
    )


# --- Periodic duties -------------------------------------------------------------------------


def runs_fail_lost_agents(*, now: Any = None) -> int:
    """Runs still ``running`` with no heartbeat for SAGA HEARTBEAT_TIMEOUT_S: the agent is gone.
    Each fails into the recovery queue as ``agent_lost`` (in its own transaction)."""
    from django.db.models import Q

    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.SAGA["HEARTBEAT_TIMEOUT_S"])
    lost = Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True, created_at__lt=cutoff)
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
            silent_s = int((now - (run.last_heartbeat_at or run.created_at)).total_seconds())
            run_fail_and_queue(
                run=run,
                actor=Actor.system("heartbeat-monitor"),
                reason="agent_lost",
                error=f"No heartbeat for {silent_s}s (threshold "
                f"{settings.SAGA['HEARTBEAT_TIMEOUT_S']}s): the agent is presumed lost.",
            )
            failed += 1
    return failed


def commands_redeliver_due(*, now: Any = None) -> int:
    """Commands for runs with a resume_url that their endpoint has not accepted yet (the first
    push failed, or Redis was down when it was to be sent) are pushed again, a bounded number of
    times; agents can always pull them regardless."""
    from recovery import notifications

    now = now or timezone.now()
    settle = timedelta(seconds=settings.SAGA["SWEEP_INTERVAL_S"])
    due = (
        AgentCommand.objects.filter(
            status=AgentCommand.Status.PENDING,
            delivered_at__isnull=True,
            created_at__lt=now - settle,
            delivery_attempts__lt=MAX_COMMAND_DELIVERY_ATTEMPTS,
        )
        .exclude(run__resume_url="")
        .values_list("pk", flat=True)
    )
    count = 0
    for command_id in due:
        notifications.enqueue_command_delivery(command_id=command_id)
        count += 1
    return count
