"""Recovery items: a run that needs a decision, with the reason it is in the queue. At most one
unresolved item per run; a run that fails again in another way updates it. Opened by the agent's
reports (through ``recovery.actions``), by the sweeper's duties and by the unwind engine; claimed
by an unwind, resolved by a decision, reopened when a compensation leaves something undone."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from infra import errors
from infra.hashing import sha256_hex
from ledger.audit import Actor, audit_record
from ledger.models import Action, ActionClass, Checkpoint, Membership, Run, max_risk
from ledger.selectors import checkpoint_latest
from ledger.transitions import transition
from recovery.models import ITEM_TRANSITIONS, RecoveryItem, Unwind
from recovery.notifications import outbox

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# The unwind engine, as the audit log names it: it resolves and reopens the items of the runs it
# compensates (recovery.unwinds acts under the same name).
ENGINE = Actor.system("unwind-engine")


# Statuses whose effects are (or may be) still in the world and so count towards an item's risk.
LIVE_ACTION_STATUSES = (
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
        Action.objects.filter(run=run, status__in=LIVE_ACTION_STATUSES).values_list("risk", flat=True)
    )
    if failed_action is not None:
        risks.append(failed_action.risk)
    return max_risk(*risks)


# Runs recorded by a gateway for one client session (saga-mcp: a run per MCP session). The gateway
# ends the run when the session closes and nothing listens for that run's commands afterwards, so a
# resume would reach no one: such a run is compensated or closed, never suggested for a resume.
SESSION_GATEWAYS = ("saga-mcp",)


def _agent_can_resume(run: Run) -> bool:
    metadata = run.metadata if isinstance(run.metadata, dict) else {}
    return metadata.get("gateway") not in SESSION_GATEWAYS


def suggest_resolution(*, run: Run, failed_action: Action | None = None) -> str:
    """What an operator most likely wants, from the latest checkpoint's recovery mode and what the
    run changed: the one rule the queue and the run page both show. A retryable failure suggests a
    resume only when the run's agent can pick one up (not a gateway session that has ended). A
    suggestion only; the operator decides."""
    actions = list(Action.objects.filter(run=run).only("status", "action_class", "retryable"))
    if any(a.status == Action.Status.UNKNOWN for a in actions):
        return RecoveryItem.Suggestion.RECONCILE
    checkpoint = checkpoint_latest(run=run)
    if checkpoint is not None and checkpoint.recovery_mode == Checkpoint.RecoveryMode.COMPENSATE_ONLY:
        return RecoveryItem.Suggestion.COMPENSATE
    if checkpoint is not None and checkpoint.recovery_mode == Checkpoint.RecoveryMode.RESUME_ONLY:
        return RecoveryItem.Suggestion.RESUME
    undoable = [
        a for a in actions if a.status == Action.Status.SUCCEEDED and a.action_class != ActionClass.READ_ONLY
    ]
    if failed_action is not None and failed_action.retryable and _agent_can_resume(run):
        return RecoveryItem.Suggestion.RESUME
    if undoable:
        return RecoveryItem.Suggestion.COMPENSATE
    return RecoveryItem.Suggestion.CLOSE


def _on_item_opened(item: RecoveryItem) -> None:
    """Tell people: the outbox rows are written in this transaction, sent by a job after it."""
    outbox.notify_item_opened(item)


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
        RecoveryItem.objects.select_for_update().filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
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
            existing = RecoveryItem.objects.select_for_update().get(
                run=run, status__in=RecoveryItem.UNRESOLVED
            )
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


# --- Transitions ------------------------------------------------------------------------------


def _item_transition(item: RecoveryItem, **fields: Any) -> RecoveryItem:
    """``ledger.transitions.transition`` on the item table, on its run's audit chain."""
    return transition(item, table=ITEM_TRANSITIONS, run=item.run, **fields)


def item_claim(*, item: RecoveryItem, actor: Actor, reason: str = "") -> RecoveryItem:
    """open → claimed (compare-and-set): a second click, tab or operator loses cleanly. A person
    who claims an unassigned item becomes its assignee ("claimed" beside "unassigned" read as a
    contradiction). The caller holds the transaction."""
    updates: dict[str, Any] = {"claimed_by": actor.user, "claimed_at": timezone.now()}
    if actor.user is not None and item.assignee_id is None:
        updates["assignee"] = actor.user
    claimed = _item_transition(
        item,
        to=RecoveryItem.Status.CLAIMED,
        actor=actor,
        kind="recovery.claimed",
        reason=reason,
        updates=updates,
    )
    outbox.notify_item_claimed(claimed)
    return claimed


def item_resolve(
    *,
    item: RecoveryItem,
    actor: Actor,
    resolution: str,
    note: str,
    allowed_from: Iterable[str],
    details: dict[str, Any] | None = None,
    resolved_by: User | None = None,
) -> RecoveryItem:
    """→ resolved with ``resolution``, from one of ``allowed_from`` (a resume or close resolves an
    open item; an unwind resolves the item it claimed). The caller holds the transaction."""
    now = timezone.now()
    updates: dict[str, Any] = {
        "resolution": resolution,
        "resolution_note": note,
        "resolved_at": now,
        "resolved_by": resolved_by if resolved_by is not None else actor.user,
    }
    if details is not None:
        updates["details"] = {**item.details, **details}
    resolved = _item_transition(
        item,
        to=RecoveryItem.Status.RESOLVED,
        actor=actor,
        kind="recovery.resolved",
        reason=note,
        updates=updates,
        data={"resolution": resolution},
        allowed_from=allowed_from,
    )
    outbox.notify_item_resolved(resolved)
    return resolved


def item_resolve_compensated(
    *, unwind: Unwind, not_undone: list[dict[str, Any]], kept: list[dict[str, Any]] | None = None
) -> RecoveryItem | None:
    """The unwind settled every step: resolve its item as compensated (or auto_compensated). A
    partial unwind resolves it too (the operator's decision was carried out), naming what it
    ``kept``."""
    item = (
        RecoveryItem.objects.filter(run_id=unwind.run_id, status__in=RecoveryItem.UNRESOLVED)
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
    if kept:
        note += " (partial: kept " + ", ".join(entry["action_tool"] for entry in kept) + ")"
    return item_resolve(
        item=item,
        actor=ENGINE,
        resolution=resolution,
        note=note,
        allowed_from=RecoveryItem.UNRESOLVED,
        details={"unwind_id": unwind.pk, "left": [], "not_undone": not_undone, "kept": kept or []},
        resolved_by=unwind.requested_by,
    )


def item_reopen_after_unwind(
    *,
    unwind: Unwind,
    run: Run,
    reason: str,
    error: str,
    left: list[dict[str, Any]],
    details: dict[str, Any] | None = None,
) -> RecoveryItem:
    """The unwind ended with steps left (or was stopped): the item goes back to the queue (open),
    naming them; ``details`` adds to what it records (a stop's report)."""
    item = (
        RecoveryItem.objects.select_for_update().filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
    )
    if item is not None and item.status == RecoveryItem.Status.CLAIMED:
        item.run = run
        _item_transition(
            item,
            to=RecoveryItem.Status.OPEN,
            actor=ENGINE,
            kind="recovery.reopened",
            reason=error,
            updates={"claimed_by": None, "claimed_at": None, "reopened_count": item.reopened_count + 1},
            data={"reason": reason, "unwind_id": unwind.pk},
            current=RecoveryItem.Status.CLAIMED,
        )
        _on_item_opened(item)
    return item_open_or_update(
        run=run,
        reason=reason,
        actor=ENGINE,
        error=error,
        details={"unwind_id": unwind.pk, "left": left, **(details or {})},
    )


@transaction.atomic
def item_assign(*, item: RecoveryItem, actor: Actor, assignee: User | None) -> RecoveryItem:
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
