"""An operator cancels a run: running or failed → cancelled, its running actions' outcomes
unknown, a cancel command for its agent, and the run in the queue when it changed something.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.rules import reason_required
from ledger.services import runs
from recovery import selectors
from recovery.actions import commands
from recovery.actions.approvals import action_approvals_lock, action_approvals_settle_for_end
from recovery.actions.refusals import audits_refusals
from recovery.models import AgentCommand, RecoveryItem
from recovery.transitions import items


@dataclass(frozen=True)
class CancelOutcome:
    run: Run
    command: AgentCommand
    unknown: list[Action]  # the actions that were running and now have an unknown outcome
    item: RecoveryItem | None  # None: the run changed nothing, so there is nothing to decide


@audits_refusals("cancel")
@transaction.atomic
def run_cancel(*, run: Run, actor: Actor, reason: str) -> CancelOutcome:
    """An operator cancels a run (the user withdrew the request, the agent misbehaves): running or
    failed → cancelled, in one transaction with everything that follows from it.

    - The actions it still had ``running`` become ``unknown`` (the agent can no longer report
      them): someone confirms whether each happened before anything is undone.
    - The agent's next write is refused (409 ``run_not_accepting_actions``) and a ``cancel``
      command waits for it (heartbeat, GET commands; pushed signed to its ``resume_url``).
    - The actions awaiting approval are rejected and their approvals withdrawn
      (``approval.withdrawn``): they leave the inbox.
    - When the run changed something (succeeded or unknown actions) it goes to the recovery queue
      with reason ``cancelled``, so a person decides whether to undo it; an unresolved item of the
      run is updated rather than duplicated (and so is one without anything to decide).

    A run that is not running or failed is refused (409 ``invalid_transition`` with its state)."""
    reason = reason_required(reason)
    # The item before the run: the order the other decisions take them in (unwind_start, close,
    # flag), so a cancel racing one of them waits for it instead of deadlocking.
    list(RecoveryItem.objects.select_for_update().filter(run_id=run.pk, status__in=RecoveryItem.UNRESOLVED))
    action_approvals_lock(run=run)
    run = runs.run_lock(run)
    # What the confirmation showed, read again under the run's lock: neither the agent nor another
    # operator can start or finish an action of the run until this transaction ends.
    preview = selectors.cancel_preview(run=run)
    runs.run_cancel(run=run, actor=actor, reason=reason)
    # Nobody is to approve what the agent of a cancelled run waited to do.
    action_approvals_settle_for_end(run=run, actor=actor, withdraw=True, ending=Run.Status.CANCELLED)
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
