"""The correction trail: the account a user (or their support team) reads after an agent run —
what changed, what was put back, what could not be undone, who reviewed it, and where the full
audit record lives. Built only from the record (actions, unwind steps, approvals, audit events);
it decides nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.urls import reverse

from ledger.models import Action, ActionClass, CompensationStrategy, Event, Run
from ledger.transitions import run_state_phrase
from recovery.models import Approval, Unwind, UnwindStep

# Actions whose effect is (or may be) out in the world.
_TOOK_EFFECT = {
    Action.Status.SUCCEEDED,
    Action.Status.UNKNOWN,
    Action.Status.COMPENSATING,
    Action.Status.COMPENSATED,
    Action.Status.COMPENSATION_FAILED,
}
# What the trail reads of each action (``_entry``, ``_why_not_undone``, ``_still_to_undo``).
_TRAIL_COLUMNS = (
    "id",
    "run_id",
    "seq",
    "tool",
    "target_type",
    "target_id",
    "action_class",
    "status",
    "completed_at",
    "compensation_tool",
    "compensation_strategy",
)
# Run states in which whatever is still in effect is a leftover rather than the intended outcome.
_UNDO_EXPECTED = {
    Run.Status.FAILED,
    Run.Status.CANCELLED,
    Run.Status.COMPENSATING,
    Run.Status.COMPENSATED,
    Run.Status.CLOSED,
}
# Audit events that record a human (or supervisor key) deciding about the run.
_DECISION_KINDS = {
    "run.compensating": "requested compensation",
    "run.resumed": "resumed the run",
    "run.closed": "closed the run",
    "run.cancelled": "cancelled the run",
    "run.flagged": "flagged the run for review",
    "action.reconciled": "reconciled an unknown outcome",
}


def _target(action: Action) -> str:
    if action.target_type and action.target_id:
        return f"{action.target_type} {action.target_id}"
    return action.target_id or action.target_type


def _describe(action: Action) -> str:
    target = _target(action)
    return f"{action.tool} on {target}" if target else action.tool


def _entry(action: Action, *, at: datetime | None, how: str = "", reason: str = "") -> dict[str, Any]:
    return {
        "action_id": action.pk,
        "seq": action.seq,
        "tool": action.tool,
        "target_type": action.target_type,
        "target_id": action.target_id,
        "action_class": action.action_class,
        "status": action.status,
        "at": at,
        "description": _describe(action),
        "how": how,
        "reason": reason,
    }


def _why_not_undone(action: Action, step: UnwindStep | None, run: Run) -> str:
    if action.status == Action.Status.UNKNOWN:
        return "the call timed out; nobody has confirmed yet whether it happened"
    if step is not None and step.status == UnwindStep.Status.DRIFTED:
        return "the target changed after the agent's action, so restoring it was left to a person"
    if step is not None and step.status == UnwindStep.Status.FAILED:
        return f"its compensation failed ({step.error[:200] or 'no detail'})"
    if step is not None and step.status == UnwindStep.Status.SKIPPED:
        return "its compensation was skipped"
    if action.status == Action.Status.COMPENSATING:
        return "its compensation is still in progress"
    if action.compensation_strategy == CompensationStrategy.NONE or (
        action.action_class == ActionClass.EXTERNAL_IRREVERSIBLE and not action.compensation_tool
    ):
        return "it cannot be undone"
    if run.status == Run.Status.CLOSED:
        return "the run was closed without undoing it"
    return "no compensation has run for it yet"


# Steps an unwind still has ahead of it (or is running): their actions are on their way back.
_STEPS_AHEAD = (
    UnwindStep.Status.PENDING,
    UnwindStep.Status.QUEUED,
    UnwindStep.Status.RUNNING,
    UnwindStep.Status.AWAITING_APPROVAL,
)


def _still_to_undo(action: Action, step: UnwindStep | None) -> bool:
    return (
        step is not None
        and step.status in _STEPS_AHEAD
        and step.unwind.status in (Unwind.Status.RUNNING, Unwind.Status.PAUSED)
    )


def _why_still_to_undo(action: Action, step: UnwindStep | None) -> str:
    if step is not None and step.status == UnwindStep.Status.AWAITING_APPROVAL:
        return f"{step.tool} is waiting for an approver"
    if action.status == Action.Status.COMPENSATING or (
        step is not None and step.status == UnwindStep.Status.RUNNING
    ):
        return "its compensation is running"
    return "its compensation is queued (newest first)"


# A kept action is still in effect: it was left as it stood when the partial unwind started.
_KEPT_STATUSES = (Action.Status.SUCCEEDED, Action.Status.COMPENSATION_FAILED)


def _partial(run: Run) -> tuple[Unwind | None, set[str]]:
    """The run's latest unwind and the actions its operator chose to keep (a partial compensation
    keeps the rest of its plan on purpose: those actions are "kept", not "not undone")."""
    latest = (
        Unwind.objects.filter(run=run)
        .select_related("requested_by", "requested_by_key")
        .order_by("-created_at", "-id")
        .first()
    )
    kept = (latest.plan or {}).get("kept", []) if latest is not None else []
    return latest, {entry["action_id"] for entry in kept}


def kept_action_ids(*, run: Run) -> set[str]:
    """The actions the run's latest (partial) compensation kept and that are still in effect."""
    _latest, kept = _partial(run)
    if not kept:
        return set()
    return set(run.actions.filter(pk__in=kept, status__in=_KEPT_STATUSES).values_list("pk", flat=True))


def run_trail(*, run: Run) -> dict[str, Any]:
    """The trail as a JSON-ready dict (``audit_url`` is a site-relative link to the run's page)."""
    # Only the actions that took effect, and only the columns the trail says (not their args,
    # snapshots and results: a long run's trail would read megabytes it never shows).
    actions = list(
        Action.objects.filter(run_id=run.pk, status__in=_TOOK_EFFECT)
        .exclude(action_class=ActionClass.READ_ONLY)
        .only(*_TRAIL_COLUMNS)
        .order_by("seq")
    )
    # The latest unwind step per action tells how (and whether) it was put back.
    latest_step: dict[str, UnwindStep] = {}
    for unwind_step in (
        UnwindStep.objects.filter(unwind__run=run).select_related("unwind").order_by("created_at", "id")
    ):
        latest_step[unwind_step.action_id] = unwind_step

    latest_unwind, kept_ids = _partial(run)
    # "Could not be undone" is said once someone decided about undoing (a compensation was asked
    # for, or the run was closed as it stands): before that, nothing was tried, so nothing failed.
    undo_decided = latest_unwind is not None or run.status == Run.Status.CLOSED
    changed = [_entry(a, at=a.completed_at) for a in actions]
    restored: list[dict[str, Any]] = []
    not_undone: list[dict[str, Any]] = []
    to_undo: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []
    for action in actions:
        step = latest_step.get(action.pk)
        if action.pk in kept_ids and action.status in _KEPT_STATUSES:
            who = _requester(latest_unwind)
            kept.append(
                _entry(
                    action,
                    at=action.completed_at,
                    reason=f"{who} chose to keep it when compensating the run (partial compensation)",
                )
            )
        elif action.status == Action.Status.COMPENSATED:
            how = step.tool if step is not None and step.tool else action.compensation_tool
            verb = (
                "corrected by"
                if action.compensation_strategy == CompensationStrategy.CORRECTION
                else "undone by"
            )
            restored.append(
                {
                    **_entry(
                        action,
                        at=step.finished_at if step else None,
                        how=f"{verb} {how}" if how else verb.split()[0],
                    ),
                    # Read back as the before-image by the action's reader (recovery.readers);
                    # false without a reader: undone as the compensator said, not proven.
                    "verified": bool(step is not None and step.verified),
                }
            )
        elif _still_to_undo(action, step):
            # An unwind in progress will get to it: not yet undone is not "could not be undone".
            to_undo.append(_entry(action, at=action.completed_at, reason=_why_still_to_undo(action, step)))
        elif undo_decided and (run.status in _UNDO_EXPECTED or step is not None):
            not_undone.append(
                _entry(action, at=action.completed_at, reason=_why_not_undone(action, step, run))
            )

    reviewed_by = _reviewers(run)
    return {
        "run_id": run.pk,
        "status": run.status,
        "changed": changed,
        "restored": restored,
        "not_undone": not_undone,
        "to_undo": to_undo,
        "kept": kept,
        "reviewed_by": reviewed_by,
        "summary": _summary(
            run, changed, restored, not_undone, reviewed_by, kept, to_undo, undecided=not undo_decided
        ),
        "audit_url": reverse("dashboard:run-detail", kwargs={"run_id": run.pk}) + "#audit",
    }


def _requester(unwind: Unwind | None) -> str:
    if unwind is None:
        return "the operator"
    if unwind.requested_by is not None:
        return unwind.requested_by.get_username()
    if unwind.requested_by_key is not None:
        return unwind.requested_by_key.name
    return "the operator"


def _reviewers(run: Run) -> list[dict[str, Any]]:
    reviewers: list[dict[str, Any]] = []
    approvals = (
        Approval.objects.filter(run=run, status__in=[Approval.Status.APPROVED, Approval.Status.REJECTED])
        .select_related("decided_by", "decided_by_key")
        .order_by("decided_at", "id")
    )
    for approval in approvals:
        if approval.decided_by is not None:
            who, actor_type = approval.decided_by.get_username(), "user"
        elif approval.decided_by_key is not None:
            who, actor_type = approval.decided_by_key.name, "agent_key"
        else:
            who, actor_type = "system", "system"
        subject = f"{approval.tool} ({approval.get_kind_display().lower()})"
        reviewers.append(
            {
                "who": who,
                "actor_type": actor_type,
                "role": "approver",
                "decision": approval.status,
                "subject": subject,
                "reason": approval.reason,
                "at": approval.decided_at,
                "bulk_id": "",
            }
        )
    decisions = (
        Event.objects.filter(run=run, kind__in=list(_DECISION_KINDS))
        .exclude(actor_type=Event.ActorType.SYSTEM)
        .order_by("id")
    )
    for event in decisions:
        # An agent cancelling or reconciling its own run is not a review; a person (or a
        # supervisor's operator key) deciding about it is.
        if event.actor_type == Event.ActorType.AGENT_KEY and event.kind not in (
            "run.compensating",
            "run.resumed",
            "run.closed",
            "run.flagged",
        ):
            continue
        reviewers.append(
            {
                "who": event.actor_label or event.actor_id,
                "actor_type": event.actor_type,
                "role": "operator",
                "decision": _DECISION_KINDS[event.kind],
                "subject": "",
                "reason": event.reason,
                "at": event.created_at,
                # Decided as part of a bulk decision by filter (recovery.actions.bulk_filter).
                "bulk_id": str((event.data or {}).get("bulk_id", "")),
            }
        )
    return reviewers


def _listing(entries: list[dict[str, Any]]) -> str:
    return "; ".join(e["description"] for e in entries)


def _summary(
    run: Run,
    changed: list[dict[str, Any]],
    restored: list[dict[str, Any]],
    not_undone: list[dict[str, Any]],
    reviewed_by: list[dict[str, Any]],
    kept: list[dict[str, Any]],
    to_undo: list[dict[str, Any]],
    *,
    undecided: bool,
) -> str:
    sentences = [
        f'The agent "{run.agent}" handled the request "{run.request[:200]}" and the run '
        f"{run_state_phrase(run.status)}."
    ]
    if not changed:
        sentences.append("It changed nothing outside Saga Admin.")
    else:
        noun = "change" if len(changed) == 1 else "changes"
        sentences.append(f"It made {len(changed)} {noun}: {_listing(changed)}.")
    if restored:
        sentences.append(f"Put back: {_listing(restored)}.")
    if kept:
        sentences.append(
            f"Partially compensated: {len(restored)} put back, {len(kept)} kept as the operator chose: "
            f"{_listing(kept)}."
        )
    if to_undo:
        sentences.append(f"Being undone now: {_listing(to_undo)}.")
    if undecided and changed and run.status in _UNDO_EXPECTED:
        sentences.append("Nobody has decided yet whether to undo what it changed.")
    for entry in not_undone:
        sentences.append(f"Not undone: {entry['description']}, because {entry['reason']}.")
    if run.status == Run.Status.SUCCEEDED and changed and not restored:
        sentences.append("Every change stands, as intended.")
    if reviewed_by:
        people = sorted({r["who"] for r in reviewed_by})
        sentences.append(f"Reviewed by {', '.join(people)}.")
    sentences.append("The full audit record is linked below.")
    return " ".join(sentences)
