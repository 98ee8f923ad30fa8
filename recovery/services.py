"""Every decision about a run: recovery items, approvals, agent commands (and, in the engine
modules, unwinds). The dashboard and the API both call these; neither re-implements a rule.

Each function checks state in the database (compare-and-set or a row lock), writes its audit
event in the same transaction, and defers side effects (jobs, notifications) to on_commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.utils import timezone

from ledger import errors
from ledger import services as ledger
from ledger.audit import Actor, audit_record
from ledger.hashing import sha256_hex
from ledger.models import Action, ActionClass, Checkpoint, Run, max_risk
from ledger.services import RecordedAction
from recovery.models import AgentCommand, Approval, RecoveryItem

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


def _item_risk(run: Run, failed_action: Action | None) -> str:
    risks = list(Action.objects.filter(run=run, status__in=_LIVE_ACTION_STATUSES).values_list("risk", flat=True))
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
        a for a in actions
        if a.status == Action.Status.SUCCEEDED and a.action_class != ActionClass.READ_ONLY
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
    existing = RecoveryItem.objects.select_for_update().filter(run=run).exclude(
        status=RecoveryItem.Status.RESOLVED
    ).first()
    if existing is None:
        try:
            with transaction.atomic():
                item = RecoveryItem.objects.create(
                    tenant_id=run.tenant_id, run=run, reason=reason, failed_action=failed_action, risk=risk,
                    suggested_resolution=suggestion, error=error, signature=signature, details=details or {},
                )
        except IntegrityError:
            # Another transaction opened the run's item a moment ago: update that one instead.
            existing = RecoveryItem.objects.select_for_update().get(run=run, status__in=["open", "claimed"])
        else:
            audit_record(tenant=run.tenant, run=run, actor=actor, kind="recovery.opened", subject=item,
                         to_state=item.status, reason=error, data={"reason": reason, "risk": risk})
            _on_item_opened(item)
            return item
    existing.reason = reason
    existing.failed_action = failed_action or existing.failed_action
    existing.risk = max_risk(existing.risk, risk)
    existing.suggested_resolution = suggestion
    existing.error = error or existing.error
    existing.signature = signature or existing.signature
    existing.details = {**existing.details, **(details or {})}
    existing.save(update_fields=["reason", "failed_action", "risk", "suggested_resolution", "error", "signature",
                                 "details", "updated_at"])
    audit_record(tenant=run.tenant, run=run, actor=actor, kind="recovery.updated", subject=existing,
                 reason=error, data={"reason": reason, "risk": existing.risk})
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
    item = item_open_or_update(run=run, reason=item_reason, actor=actor, failed_action=failed_action, error=error)
    return FailOutcome(run=run, item=item)


@transaction.atomic
def action_fail_and_queue(
    *, action: Action, actor: Actor, error: str, retryable: bool, layer: str, outcome_unknown: bool = False
) -> Action:
    """An action failed; a timed-out call whose outcome is unknown also queues the run, because a
    human (or a reader) must confirm whether it happened before anything resumes or undoes it."""
    ledger.action_fail(action=action, actor=actor, error=error, retryable=retryable, layer=layer,
                       outcome_unknown=outcome_unknown)
    if outcome_unknown:
        item_open_or_update(run=action.run, reason=RecoveryItem.Reason.OUTCOME_UNKNOWN, actor=actor,
                            failed_action=action, error=error)
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
        ledger.run_fail(run=run, actor=actor, error=message, reason=RecoveryItem.Reason.VERIFICATION_FAILED,
                        failed_action=action)
    item = item_open_or_update(run=run, reason=RecoveryItem.Reason.VERIFICATION_FAILED, actor=actor,
                               failed_action=action, error=message,
                               details={"verification": {"expected": expected, "actual": actual}})
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
        ledger.action_await_approval(action=action, actor=actor)
        approval = Approval.objects.create(
            tenant_id=run.tenant_id, run=run, kind=Approval.Kind.ACTION, action=action, risk=action.risk,
            tool=action.tool, args=action.args, args_hash=sha256_hex(action.args),
            requested_by_key=actor.key, requested_by=actor.user, expires_at=approval_expiry_from(),
        )
        audit_record(tenant=run.tenant, run=run, actor=actor, kind="approval.requested", subject=approval,
                     to_state=approval.status, data={"tool": action.tool, "risk": action.risk,
                                                     "args_hash": approval.args_hash})
        _on_approval_requested(approval)
    return recorded


def _is_requester(approval: Approval, actor: Actor) -> bool:
    if actor.user is not None and approval.requested_by_id == actor.user.pk:
        return True
    return actor.key is not None and approval.requested_by_key_id == actor.key.pk


def _decide(approval: Approval, *, to: str, actor: Actor, reason: str, updates: dict[str, Any]) -> Approval:
    """Compare-and-set pending → to, refusing an expired approval (and recording the expiry)."""
    if not reason.strip():
        raise errors.ValidationFailed("A reason is required for an approval decision.", details={"reason": "required"})
    current = Approval.objects.select_for_update().get(pk=approval.pk)
    if current.status != Approval.Status.PENDING:
        raise errors.InvalidTransition(current, to=to, current=current.status)
    if current.expires_at <= timezone.now():
        raise errors.ApprovalExpired(f"Approval {approval.pk} expired at {current.expires_at.isoformat()}.",
                                     details={"approval_id": approval.pk, "current": Approval.Status.EXPIRED})
    if to == Approval.Status.APPROVED and current.risk == "critical" and _is_requester(current, actor):
        raise errors.FourEyesRequired(
            "Critical-risk approvals need a second person: whoever asked for this cannot approve it.",
            details={"approval_id": approval.pk},
        )
    fields = {"status": to, "decided_at": timezone.now(), "reason": reason,
              "decided_by": actor.user, "decided_by_key": actor.key, **updates}
    for name, value in fields.items():
        setattr(current, name, value)
    current.save(update_fields=list(fields))
    return current


@transaction.atomic
def approval_approve(
    *, approval: Approval, actor: Actor, reason: str, args: Any = None, shown_args_hash: str | None = None
) -> Approval:
    """Approve exactly what was shown. ``shown_args_hash`` (what the approver's screen showed)
    must still match; edited ``args`` replace the action's args and both versions are audited."""
    if shown_args_hash is not None and shown_args_hash != approval.args_hash:
        raise errors.Conflict("The arguments changed since they were shown to you; review them again.",
                              details={"approval_id": approval.pk, "args_hash": approval.args_hash},
                              code="approval_args_changed")
    edited = args is not None and sha256_hex(args) != approval.args_hash
    updates: dict[str, Any] = {}
    if edited:
        if not isinstance(args, dict):
            raise errors.ValidationFailed("Edited args must be a JSON object.", details={"args": type(args).__name__})
        updates = {"approved_args": args, "approved_args_hash": sha256_hex(args)}
    else:
        updates = {"approved_args": approval.args, "approved_args_hash": approval.args_hash}
    decided = _decide(approval, to=Approval.Status.APPROVED, actor=actor, reason=reason, updates=updates)
    audit_record(
        tenant=decided.run.tenant, run=decided.run, actor=actor, kind="approval.approved", subject=decided,
        from_state=Approval.Status.PENDING, to_state=decided.status, reason=reason,
        data={"args_shown": decided.args, "args_approved": decided.approved_args, "edited": edited,
              "args_hash": decided.args_hash, "approved_args_hash": decided.approved_args_hash},
    )
    if decided.kind == Approval.Kind.ACTION:
        ledger.action_approve(action=decided.action, actor=actor, reason=reason,
                              args=decided.approved_args if edited else None)
    else:
        from recovery import unwinds

        unwinds.step_approval_decided(approval=decided, actor=actor)
    return decided


@transaction.atomic
def approval_reject(*, approval: Approval, actor: Actor, reason: str) -> Approval:
    decided = _decide(approval, to=Approval.Status.REJECTED, actor=actor, reason=reason, updates={})
    audit_record(tenant=decided.run.tenant, run=decided.run, actor=actor, kind="approval.rejected", subject=decided,
                 from_state=Approval.Status.PENDING, to_state=decided.status, reason=reason)
    if decided.kind == Approval.Kind.ACTION:
        ledger.action_reject(action=decided.action, actor=actor, reason=reason)
    else:
        from recovery import unwinds

        unwinds.step_approval_decided(approval=decided, actor=actor)
    return decided


def approvals_expire_due(*, now: Any = None) -> int:
    """Expire pending approvals past their deadline (a periodic job). The gated action becomes
    rejected, so an agent polling it sees ``expired`` and start() refuses."""
    now = now or timezone.now()
    expired = 0
    for approval_id in Approval.objects.filter(status=Approval.Status.PENDING, expires_at__lte=now).values_list(
        "pk", flat=True
    ):
        with transaction.atomic():
            approval = Approval.objects.select_for_update(skip_locked=True).filter(
                pk=approval_id, status=Approval.Status.PENDING
            ).select_related("run__tenant", "action").first()
            if approval is None:
                continue
            approval.status = Approval.Status.EXPIRED
            approval.decided_at = now
            approval.reason = "expired without a decision"
            approval.save(update_fields=["status", "decided_at", "reason"])
            actor = Actor.system("approval-expiry")
            audit_record(tenant=approval.run.tenant, run=approval.run, actor=actor, kind="approval.expired",
                         subject=approval, from_state=Approval.Status.PENDING, to_state=Approval.Status.EXPIRED)
            if approval.kind == Approval.Kind.ACTION:
                ledger.action_reject(action=approval.action, actor=actor, reason="approval expired")
            else:
                from recovery import unwinds

                unwinds.step_approval_decided(approval=approval, actor=actor)
            expired += 1
    return expired


# --- Agent commands ------------------------------------------------------------------------


def commands_pending(*, run: Run) -> QuerySet[AgentCommand]:
    return AgentCommand.objects.filter(run=run, status=AgentCommand.Status.PENDING).select_related("checkpoint")


@transaction.atomic
def command_issue(
    *, run: Run, kind: str, actor: Actor, reason: str, checkpoint: Checkpoint | None = None
) -> AgentCommand:
    """Queue a resume/cancel command for the agent: it is pulled (GET commands, heartbeat) and,
    when the run has a resume_url, pushed there by a job after commit."""
    if kind not in AgentCommand.Kind.values:
        raise errors.ValidationFailed(f"Unknown command kind {kind!r}.", details={"kind": kind})
    command = AgentCommand.objects.create(
        tenant_id=run.tenant_id, run=run, kind=kind, checkpoint=checkpoint, reason=reason, created_by=actor.user
    )
    audit_record(tenant=run.tenant, run=run, actor=actor, kind=f"command.{kind}", subject=command, reason=reason,
                 to_state=command.status, data={"checkpoint": getattr(checkpoint, "pk", None)})
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
        audit_record(tenant=command.run.tenant, run=command.run, actor=actor, kind="command.acked", subject=command,
                     from_state=AgentCommand.Status.PENDING, to_state=AgentCommand.Status.ACKED)
    return command
