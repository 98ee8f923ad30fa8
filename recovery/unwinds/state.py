"""The engine's state sets, and the moves every part of it shares: the compare-and-set of a step
or of the unwind (each with its audit event), the unwind's row lock, and the plan as it was
frozen when the unwind started.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from infra import errors
from ledger.audit import Actor
from ledger.transitions import transition
from recovery import metrics
from recovery.models import STEP_TRANSITIONS, UNWIND_TRANSITIONS, Unwind, UnwindStep
from recovery.transitions import items

ENGINE = items.ENGINE
IN_FLIGHT = (UnwindStep.Status.QUEUED, UnwindStep.Status.RUNNING, UnwindStep.Status.AWAITING_APPROVAL)
PROBLEMS = (UnwindStep.Status.FAILED, UnwindStep.Status.DRIFTED)
# What an operator can stop (``recovery.unwinds.moves.unwind_stop``).
STOPPABLE = (Unwind.Status.RUNNING, Unwind.Status.PAUSED)


def step_transition(
    step: UnwindStep,
    *,
    to: str,
    allowed_from: tuple[str, ...],
    actor: Actor,
    kind: str,
    reason: str = "",
    updates: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    where: dict[str, Any] | None = None,
) -> None:
    """Compare-and-set one step from the status the caller holds (``step.status``, read in this
    transaction) and audit it; ``InvalidTransition`` when another process changed it first."""
    transition(
        step,
        table=STEP_TRANSITIONS,
        to=to,
        run=step.unwind.run,
        actor=actor,
        kind=kind,
        reason=reason,
        updates=updates,
        data={"unwind_id": step.unwind_id, "action_id": step.action_id, "tool": step.tool, **(data or {})},
        allowed_from=allowed_from,
        current=step.status,
        where=where,
    )
    metrics.step_moved(to=to, kind=kind)


def unwind_set_status(
    unwind: Unwind,
    *,
    to: str,
    allowed_from: tuple[str, ...],
    actor: Actor,
    kind: str,
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> None:
    """Compare-and-set the unwind (whose row the caller holds locked) from one of
    ``allowed_from`` (each caller's own move, narrower than the table) and audit it."""
    now = timezone.now()
    finished = to in (Unwind.Status.COMPLETED, Unwind.Status.FAILED, Unwind.Status.CANCELLED)
    try:
        with transaction.atomic():
            transition(
                unwind,
                table=UNWIND_TRANSITIONS,
                to=to,
                run=unwind.run,
                actor=actor,
                kind=kind,
                reason=reason,
                updates={"finished_at": now if finished else None},
                data=data,
                allowed_from=allowed_from,
                current=unwind.status,
            )
    except IntegrityError as exc:
        # Reactivating an old unwind while a newer one runs: one active unwind per run.
        raise errors.InvalidTransition(
            unwind,
            to=to,
            current=unwind.status,
            message=f"Run {unwind.run_id} already has another unwind in progress.",
        ) from exc


def unwind_pause_for_step(unwind: Unwind, step: UnwindStep) -> None:
    """running → paused while ``step`` waits for a person (its approval asked, or asked again)."""
    unwind_set_status(
        unwind,
        to=Unwind.Status.PAUSED,
        allowed_from=(Unwind.Status.RUNNING,),
        actor=ENGINE,
        kind="unwind.paused",
        data={"waiting_for_step": step.pk},
    )


def lock_unwind(unwind_id: str) -> Unwind | None:
    return (
        Unwind.objects.select_for_update(of=("self",))
        .select_related("run__tenant", "item")
        .filter(pk=unwind_id)
        .first()
    )


def all_steps(unwind: Unwind) -> list[UnwindStep]:
    return list(unwind.steps.select_related("action").order_by("position"))


def planned_step(unwind: Unwind, step: UnwindStep) -> dict[str, Any]:
    """The step as the plan froze it when the unwind started ({} for an unwind without one),
    as its approval card shows it: the governing policy, the compensator, the plan's notes."""
    planned_steps = (unwind.plan or {}).get("steps", [])
    # Steps were created in plan order, so the position is the index; checked, not assumed.
    if step.position < len(planned_steps) and planned_steps[step.position].get("action_id") == step.action_id:
        return dict(planned_steps[step.position])
    return next((dict(p) for p in planned_steps if p.get("action_id") == step.action_id), {})
