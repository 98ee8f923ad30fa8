"""The agent's reports of how its run ended, and those that put a run in the recovery queue: a
completed run, a failed run (auto-compensated when the policy allows, withheld when a person
resumed it), a failed action whose outcome is unknown, a verification mismatch. A run does not
end while one of its actions waits for approval, unless the agent withdraws it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from ledger.audit import Actor, audit_record
from ledger.models import Action, Run
from ledger.services import runs
from ledger.services.actions import moves
from recovery.actions import commands
from recovery.actions.approvals import action_approvals_lock, action_approvals_settle_for_end
from recovery.actions.compensations import AUTO_COMPENSATOR, auto_compensable, auto_compensate
from recovery.models import AgentCommand, RecoveryItem, Unwind
from recovery.transitions import items


@dataclass(frozen=True)
class FailOutcome:
    run: Run
    item: RecoveryItem | None
    unwind: Unwind | None = None  # when the failure was auto-compensated


@transaction.atomic
def run_complete(*, run: Run, actor: Actor, summary: str = "", withdraw_approvals: bool = False) -> Run:
    """The agent reports its run succeeded: running → succeeded. Refused (409
    ``pending_approvals``) while an action of the run awaits approval, unless
    ``withdraw_approvals``: then those approvals are withdrawn and the actions rejected first, in
    the same transaction. Returns the run as it is now."""
    action_approvals_lock(run=run)
    run = runs.run_lock(run)
    action_approvals_settle_for_end(
        run=run, actor=actor, withdraw=withdraw_approvals, ending=Run.Status.SUCCEEDED
    )
    return runs.run_complete(run=run, actor=actor, summary=summary)


@transaction.atomic
def run_fail_and_queue(
    *,
    run: Run,
    actor: Actor,
    error: str,
    reason: str = "failed",
    failed_action: Action | None = None,
    withdraw_approvals: bool = False,
) -> FailOutcome:
    """The agent reports its run failed: record it and put the run in the recovery queue. Refused
    (409 ``pending_approvals``) while an action of the run awaits approval, unless
    ``withdraw_approvals`` (as ``run_complete``)."""
    action_approvals_lock(run=run)
    run = runs.run_lock(run)
    action_approvals_settle_for_end(
        run=run, actor=actor, withdraw=withdraw_approvals, ending=Run.Status.FAILED
    )
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
    unwind = auto_compensate(run=run, item=item)
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
    max_allowed = auto_compensable(run)
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
