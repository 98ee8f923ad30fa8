"""State machines and the one compare-and-set that moves every status column.

The tables say which state may follow which. ``compare_and_set`` is the only code that writes a
``status``: an ``UPDATE … WHERE status = <what the caller saw>``, so a concurrent transition that
got there first makes this one update nothing, and it loses cleanly with ``InvalidTransition``
(409) naming the state it lost to. ``transition`` adds the audit event, in the same transaction.

The tables of the recovery app's objects (items, unwinds, steps) sit beside their models in
``recovery/models.py``: the record does not know about the decisions, but the decisions use the
same compare-and-set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.db.models import Model
from django.utils import timezone

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Action, Run

Table = Mapping[str, Iterable[str]]
M = TypeVar("M", bound=Model)

RUN_TRANSITIONS: dict[str, set[str]] = {
    Run.Status.RUNNING: {Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED},
    # A verification that fails after the agent reported success reopens the run. A run flagged
    # for review (recovery.actions.resolutions.run_flag) is compensated or resumed like a failed one.
    Run.Status.SUCCEEDED: {Run.Status.FAILED, Run.Status.COMPENSATING, Run.Status.RUNNING},
    Run.Status.FAILED: {Run.Status.COMPENSATING, Run.Status.RUNNING, Run.Status.CLOSED},
    Run.Status.CANCELLED: {Run.Status.COMPENSATING, Run.Status.CLOSED},
    # closed: a partial unwind finished, and the actions the operator kept stand.
    Run.Status.COMPENSATING: {Run.Status.COMPENSATED, Run.Status.FAILED, Run.Status.CLOSED},
    # A flagged run's leftovers (kept, skipped) can still be undone.
    Run.Status.COMPENSATED: {Run.Status.COMPENSATING},
    Run.Status.CLOSED: {Run.Status.COMPENSATING},
}

# A run's state in a sentence, after "the run": "the run succeeded", "the run was cancelled", never
# "the run is succeeded" (a state's name is not an adjective). Every sentence a person reads that
# names a run's state takes its words from here.
_RUN_STATE_PHRASES: dict[str, str] = {
    Run.Status.RUNNING: "is running",
    Run.Status.SUCCEEDED: "succeeded",
    Run.Status.FAILED: "failed",
    Run.Status.CANCELLED: "was cancelled",
    Run.Status.COMPENSATING: "is being compensated",
    Run.Status.COMPENSATED: "was compensated",
    Run.Status.CLOSED: "was closed",
}


def run_state_phrase(status: str) -> str:
    """What follows "the run" in a sentence about its ``status`` ("succeeded", "was cancelled")."""
    return _RUN_STATE_PHRASES.get(status, f"is {str(status).replace('_', ' ')}")


ACTION_TRANSITIONS: dict[str, set[str]] = {
    Action.Status.PLANNED: {Action.Status.AWAITING_APPROVAL, Action.Status.RUNNING},
    Action.Status.AWAITING_APPROVAL: {Action.Status.APPROVED, Action.Status.REJECTED},
    Action.Status.APPROVED: {Action.Status.RUNNING},
    # Asked again after its approval expired or was rejected
    # (recovery.actions.approvals.approval_request_again).
    Action.Status.REJECTED: {Action.Status.AWAITING_APPROVAL},
    Action.Status.RUNNING: {Action.Status.SUCCEEDED, Action.Status.FAILED, Action.Status.UNKNOWN},
    Action.Status.UNKNOWN: {Action.Status.SUCCEEDED, Action.Status.FAILED},
    Action.Status.FAILED: {Action.Status.RUNNING},
    Action.Status.SUCCEEDED: {Action.Status.COMPENSATING},
    Action.Status.COMPENSATING: {
        Action.Status.COMPENSATED,
        Action.Status.COMPENSATION_FAILED,
        Action.Status.SUCCEEDED,
    },
    Action.Status.COMPENSATION_FAILED: {Action.Status.COMPENSATING},
    Action.Status.COMPENSATED: set(),
}


def _sources_for(table: Table, to: str) -> list[str]:
    """Every state the table lets ``to`` follow."""
    return [state for state, targets in table.items() if to in targets]


def _current_status(model: type[Model], pk: Any) -> str:
    # order_by(): no model ordering (Action's joins ledger_run) on a primary-key read.
    current = model._default_manager.filter(pk=pk).order_by().values_list("status", flat=True).first()
    if current is None:
        raise errors.NotFound.for_id(model.__name__, str(pk))
    return str(current)


def compare_and_set(
    obj: Model,
    *,
    table: Table,
    to: str,
    allowed_from: Iterable[str] | None = None,
    updates: Mapping[str, Any] | None = None,
    current: str | None = None,
    where: Mapping[str, Any] | None = None,
) -> str:
    """Move ``obj.status`` to ``to`` if the row's current status allows it; return the old status.
    Raises ``InvalidTransition`` when it does not (or when another process moved it first).

    ``allowed_from`` narrows the table's sources for this call (a transition that is allowed in
    general but not from every state here). ``current``: the status the caller has just read in
    this transaction (saves reading it again; the UPDATE's WHERE clause still decides). With one
    possible source and no ``current``, that source is assumed and the UPDATE checks it, which
    saves a statement per transition. ``where``: more columns the row must still have (a lease's
    fencing token)."""
    sources = list(allowed_from) if allowed_from is not None else _sources_for(table, to)
    model = type(obj)
    if current is None and len(sources) == 1:
        current = sources[0]
    if current is None:
        current = _current_status(model, obj.pk)
    if current not in sources:
        raise errors.InvalidTransition(obj, to=to, current=current)
    fields = {"status": to, "updated_at": timezone.now(), **(updates or {})}
    rows = model._default_manager.filter(pk=obj.pk, status=current, **(where or {}))
    if rows.update(**fields) != 1:
        raise errors.InvalidTransition(obj, to=to, current=_current_status(model, obj.pk))
    for name, value in fields.items():
        setattr(obj, name, value)
    return current


def transition(
    obj: M,
    *,
    table: Table,
    to: str,
    run: Run,
    actor: Actor,
    kind: str,
    reason: str = "",
    updates: Mapping[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    allowed_from: Iterable[str] | None = None,
    current: str | None = None,
    where: Mapping[str, Any] | None = None,
    run_updates: dict[str, Any] | None = None,
) -> M:
    """``compare_and_set`` and its audit event (on ``run``'s chain), in the caller's transaction.
    Returns ``obj``, moved."""
    previous = compare_and_set(
        obj,
        table=table,
        to=to,
        allowed_from=allowed_from,
        updates=updates,
        current=current,
        where=where,
    )
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind=kind,
        subject=obj,
        from_state=previous,
        to_state=to,
        reason=reason,
        data=data,
        run_updates=run_updates,
    )
    return obj
