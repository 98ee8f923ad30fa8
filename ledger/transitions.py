"""State machines and the one compare-and-set that moves every status column.

The tables say which state may follow which. The helpers here are the only code that writes a
``status`` (``tests/test_status_writes.py`` holds every other module to it): one ``UPDATE …
WHERE status = <a state the table lets the new one follow>``, so a concurrent transition that got
there first makes this one update nothing. Its callers differ only in what losing means:

- ``compare_and_set`` loses with ``InvalidTransition`` (409) naming the state it lost to;
  ``transition`` adds the audit event, in the same transaction;
- ``try_compare_and_set`` answers None instead (an agent acknowledging a command twice, a worker
  whose lease was fenced off: the caller goes on either way);
- ``compare_and_set_rows`` moves a queryset's rows in one UPDATE and counts those that moved (an
  outbox claim, a sweep giving up on a batch, a bulk item's ``outcome``: its status by another
  name).

A caller that holds the row's lock (``select_for_update``) passes the state it read there as
``current``: the UPDATE then cannot lose, and the lock stays the caller's. ``updated_at`` is
written with the move when the model has one (approvals and agent commands have none).

The tables of the recovery app's objects sit beside their models or in the module that owns
their states: items, unwinds and steps in ``recovery/models.py``; approvals in
``recovery.transitions.approvals``; agent commands in ``recovery.actions.commands``; bulk
operations and their items' outcomes in ``recovery.bulk.models``; the outbox in
``recovery.notifications.delivery``. The record does not know about the decisions, but the
decisions use the same compare-and-set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.db.models import Model, Q, QuerySet
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


def _move(
    rows: QuerySet[Any],
    *,
    to: str,
    sources: Iterable[str],
    updates: Mapping[str, Any] | None,
    when: Mapping[str, Q] | None = None,
    column: str = "status",
) -> tuple[int, dict[str, Any]]:
    """The one UPDATE behind every status change: ``rows`` whose ``column`` is one of ``sources``
    (and, in a state ``when`` names, that also meet its condition) become ``to``, with ``updates``.
    ``updated_at`` is written when the model has one (a queryset's UPDATE skips ``auto_now``);
    ``updates`` may set it, so that it reads the same clock as the caller's other columns.
    Returns how many rows moved, and the columns written."""
    sources = list(sources)
    if not sources:
        return 0, {}  # no state may become ``to``: an empty condition would match every row
    condition = Q()
    for state in sources:
        condition |= Q(**{column: state}) & (when or {}).get(state, Q())
    fields: dict[str, Any] = {column: to}
    if any(field.name == "updated_at" for field in rows.model._meta.concrete_fields):
        fields["updated_at"] = timezone.now()
    fields.update(updates or {})
    return rows.filter(condition).update(**fields), fields


def _move_one(
    obj: Model,
    *,
    table: Table,
    to: str,
    allowed_from: Iterable[str] | None,
    updates: Mapping[str, Any] | None,
    current: str | None,
    where: Mapping[str, Any] | None,
) -> tuple[bool, str]:
    """(True, the state it moved from); (False, the state the caller saw) when that is no source
    of ``to``; (False, "") when the UPDATE matched nothing (the row's state is not read here)."""
    sources = list(allowed_from) if allowed_from is not None else _sources_for(table, to)
    model = type(obj)
    if current is None and len(sources) == 1:
        current = sources[0]
    if current is None:
        current = _current_status(model, obj.pk)
    if current not in sources:
        return False, current
    moved, fields = _move(
        model._default_manager.filter(pk=obj.pk, **(where or {})), to=to, sources=[current], updates=updates
    )
    if moved != 1:
        return False, ""
    for name, value in fields.items():
        setattr(obj, name, value)
    return True, current


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
    this transaction, or holds under the row's lock (saves reading it again; the UPDATE's WHERE
    clause still decides). With one possible source and no ``current``, that source is assumed and
    the UPDATE checks it, which saves a statement per transition. ``where``: more columns the row
    must still have (a lease's fencing token). ``updates``: the other columns the move writes."""
    moved, state = _move_one(
        obj, table=table, to=to, allowed_from=allowed_from, updates=updates, current=current, where=where
    )
    if not moved:
        raise errors.InvalidTransition(obj, to=to, current=state or _current_status(type(obj), obj.pk))
    return state


def try_compare_and_set(
    obj: Model,
    *,
    table: Table,
    to: str,
    allowed_from: Iterable[str] | None = None,
    updates: Mapping[str, Any] | None = None,
    current: str | None = None,
    where: Mapping[str, Any] | None = None,
) -> str | None:
    """``compare_and_set`` where losing is an answer, not an error: the old status when ``obj``
    moved, None when it did not (another process moved it first, a fencing token changed, or its
    state is not a source of ``to``). For the writes whose callers go on either way: an agent
    acknowledging a command twice, a worker whose lease was taken over."""
    moved, state = _move_one(
        obj, table=table, to=to, allowed_from=allowed_from, updates=updates, current=current, where=where
    )
    return state if moved else None


def compare_and_set_rows(
    rows: QuerySet[Any],
    *,
    table: Table,
    to: str,
    allowed_from: Iterable[str] | None = None,
    when: Mapping[str, Q] | None = None,
    updates: Mapping[str, Any] | None = None,
    column: str = "status",
) -> int:
    """Move every row of ``rows`` whose state is a source of ``to`` (``allowed_from`` narrows
    them) in one UPDATE; return how many moved. A row another process moved first, or that is
    in no source state, is left as it is: counted out, not an error. ``when``: a further condition
    per source state, which a row in that state must also meet (an outbox claim takes a pending
    row when it is due, a sending one when its lease expired). ``column``: the state's column when
    it is not ``status`` (a bulk item's ``outcome``)."""
    sources = list(allowed_from) if allowed_from is not None else _sources_for(table, to)
    unknown = set(when or {}) - set(sources)
    if unknown:
        raise ValueError(f"{sorted(unknown)} cannot become {to}: a condition for no source state")
    return _move(rows, to=to, sources=sources, updates=updates, when=when, column=column)[0]


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
