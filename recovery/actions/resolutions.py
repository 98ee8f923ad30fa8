"""Resolving a run's recovery item without compensating it: resume (a command to its agent),
close, and flagging any run for a person's review.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Checkpoint, Run
from ledger.rules import reason_required
from ledger.services import runs
from recovery import decisions, selectors
from recovery.actions import commands
from recovery.actions.refusals import audits_refusals, refuse_unknown_outcomes
from recovery.models import AgentCommand, RecoveryItem
from recovery.transitions import items


@audits_refusals("resume")
@transaction.atomic
def item_resume(
    *, item: RecoveryItem, actor: Actor, reason: str, checkpoint: Checkpoint | None = None
) -> AgentCommand:
    """Resolve the item as resumed, put the run back to running and queue a resume command for
    the agent (pulled on heartbeat, pushed to resume_url when set)."""
    reason = reason_required(reason)
    item = RecoveryItem.objects.select_related("run__tenant").get(pk=item.pk)
    preview = selectors.resume_preview(item=item, checkpoint=checkpoint)
    refuse_unknown_outcomes(preview.unknown, doing="resume")
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


@audits_refusals("close")
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


@audits_refusals("flag")
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
