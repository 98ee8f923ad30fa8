"""How an unwind ends: settled when no step is left to run (the run and its recovery item with
it), and the report of one an operator stopped (what was undone, what was not).
"""

from __future__ import annotations

from typing import Any

from ledger.models import Risk, Run, max_risk
from ledger.services import runs
from recovery.models import RecoveryItem, Unwind, UnwindStep
from recovery.notifications import outbox
from recovery.transitions import items
from recovery.unwinds.state import ENGINE, PROBLEMS, all_steps, unwind_set_status


def _left_over(steps: list[UnwindStep]) -> list[dict[str, Any]]:
    return [
        {
            "step_id": s.pk,
            "action_id": s.action_id,
            "tool": s.tool,
            "action_tool": s.action.tool,
            "status": s.status,
            "error": s.error,
            # The reader's verdict (recovery.readers.checks): False for an undo that did not come
            # back (not_restored), with what differs.
            "verified": s.verified,
            "differences": (s.read_checks or {}).get("differences") or []
            if isinstance(s.read_checks, dict)
            else [],
        }
        for s in steps
        if s.status in PROBLEMS or s.status == UnwindStep.Status.PENDING
    ]


def _not_restored(entry: dict[str, Any]) -> bool:
    return entry["status"] == UnwindStep.Status.FAILED and entry.get("verified") is False


def _reopen_reason(left: list[dict[str, Any]]) -> str:
    """Why the item goes back to the queue: ``state_drift`` when only drifted steps are left,
    ``not_restored`` when the rest are undos acknowledged but not read back as they were,
    else ``compensation_failed``."""
    problems = [entry for entry in left if entry["status"] in PROBLEMS]
    if problems and all(entry["status"] == UnwindStep.Status.DRIFTED for entry in problems):
        return RecoveryItem.Reason.STATE_DRIFT
    if problems and all(
        entry["status"] == UnwindStep.Status.DRIFTED or _not_restored(entry) for entry in problems
    ):
        return RecoveryItem.Reason.NOT_RESTORED
    return RecoveryItem.Reason.COMPENSATION_FAILED


def _read_sentences(left: list[dict[str, Any]]) -> str:
    """The sentences of the steps a reader stopped or caught (what someone else changed, what did
    not come back), for the item: the step's own error says it."""
    said = [entry["error"] for entry in left if entry["status"] in PROBLEMS and entry.get("differences")]
    return " ".join(said[:3])


def unwind_finish(*, unwind: Unwind, steps: list[UnwindStep]) -> Unwind:
    """No step left to run (or halted): settle the run and the recovery item. Caller holds the
    unwind's row lock inside a transaction."""
    left = _left_over(steps)
    complete = not left
    not_undone = [
        {"step_id": s.pk, "action_id": s.action_id, "action_tool": s.action.tool, "error": s.error}
        for s in steps
        if s.status == UnwindStep.Status.SKIPPED
    ]
    # A partial unwind: the plan's undoable actions the operator chose to keep (recovery.planner).
    kept = [
        {"action_id": entry["action_id"], "action_tool": entry["action_tool"]}
        for entry in (unwind.plan or {}).get("kept", [])
    ]
    run = Run.objects.select_for_update().select_related("tenant").get(pk=unwind.run_id)
    summary = (
        f"all {len(steps)} steps settled"
        if complete
        else f"{len(left)} of {len(steps)} steps not compensated: "
        + ", ".join(f"{entry['tool']} ({entry['status']})" for entry in left)
    )
    if kept:
        summary += "; kept as the operator chose: " + ", ".join(entry["action_tool"] for entry in kept)
    if sentences := _read_sentences(left):
        summary += f". {sentences}"
    unwind_set_status(
        unwind,
        to=Unwind.Status.COMPLETED if complete else Unwind.Status.FAILED,
        allowed_from=(Unwind.Status.RUNNING,),
        actor=ENGINE,
        kind="unwind.completed" if complete else "unwind.failed",
        reason=summary,
        data={"left": left, "not_undone": not_undone, "kept": kept},
    )
    runs.run_compensation_finished(
        run=run, actor=ENGINE, complete=complete, reason=summary, partial=bool(kept)
    )
    if complete:
        items.item_resolve_compensated(unwind=unwind, not_undone=not_undone, kept=kept)
    else:
        items.item_reopen_after_unwind(
            unwind=unwind, run=run, reason=_reopen_reason(left), error=summary, left=left
        )
    outbox.notify_unwind_finished(
        unwind,
        run=run,
        summary=summary,
        risk=max_risk(*(s.action.risk for s in steps)) if steps else Risk.LOW,
    )
    return unwind


# --- A stopped unwind's report ------------------------------------------------------------


def _step_entry(step: UnwindStep) -> dict[str, Any]:
    return {
        "step_id": step.pk,
        "action_id": step.action_id,
        "action_seq": step.action.seq,
        "tool": step.tool,
        "action_tool": step.action.tool,
        "status": step.status,
        "error": step.error,
    }


def stop_report(steps: list[UnwindStep], *, by: str, reason: str, at: str) -> tuple[str, dict[str, Any]]:
    """What a stopped unwind undid and did not (a sentence for the item, the details for the
    queue, the run page and the API)."""
    undone = [_step_entry(s) for s in steps if s.status == UnwindStep.Status.DONE]
    running = [_step_entry(s) for s in steps if s.status == UnwindStep.Status.RUNNING]
    not_undone = [
        _step_entry(s) for s in steps if s.status not in (UnwindStep.Status.DONE, UnwindStep.Status.RUNNING)
    ]

    def names(entries: list[dict[str, Any]], *, status: bool = False) -> str:
        return ", ".join(
            f"{e['action_tool']} (#{e['action_seq']}{', ' + e['status'] if status else ''})" for e in entries
        )

    summary = f"Compensation stopped by {by}: {reason}. Undone: {names(undone) or 'nothing'}."
    if not_undone:
        summary += f" Not undone: {names(not_undone, status=True)}."
    if running:
        summary += (
            f" Still running when stopped: {names(running)} (its outcome is recorded when the call returns)."
        )
    details = {
        "by": by,
        "reason": reason,
        "at": at,
        "undone": undone,
        "not_undone": not_undone,
        "running": running,
    }
    return summary, details


def stopped_item_refresh(unwind: Unwind) -> None:
    """The step that was running when its unwind stopped has finished: its item (if it still
    waits for a decision about this unwind) says what happened to it."""
    item = (
        RecoveryItem.objects.select_for_update()
        .filter(run_id=unwind.run_id, status__in=RecoveryItem.UNRESOLVED)
        .first()
    )
    stopped = (item.details or {}).get("stopped") if item is not None else None
    if item is None or not isinstance(stopped, dict) or item.details.get("unwind_id") != unwind.pk:
        return
    summary, details = stop_report(
        all_steps(unwind),
        by=str(stopped.get("by", "")),
        reason=str(stopped.get("reason", "")),
        at=str(stopped.get("at", "")),
    )
    items.item_open_or_update(
        run=unwind.run,
        reason=item.reason,
        actor=ENGINE,
        error=summary,
        details={"left": details["not_undone"] + details["running"], "stopped": details},
    )
