"""Reads shared by the API and the dashboard. Every lookup is narrowed to the caller's reach
(``ledger.scoping``): another tenant's object, or another agent's run, is simply not found."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Q, QuerySet, Subquery

from infra.pagination import Key, Page, keyset_page
from ledger.models import Action, ActionClass, AgentKey, ArchivedRun, Checkpoint, Run
from ledger.rules import COMPENSATABLE_CLASSES, is_pivot, pivot_order_warning
from ledger.scoping import Reach


def run_get(*, reach: Reach, run_id: str) -> Run:
    return reach.get(Run.objects.select_related("tenant"), run_id, owner_field="owner")


def action_get(*, reach: Reach, action_id: str) -> Action:
    return reach.get(Action.objects.select_related("run", "run__tenant"), action_id, owner_field="run__owner")


def runs_reached(*, reach: Reach) -> QuerySet[Run]:
    """The runs ``reach`` lists (newest first is the caller's ordering)."""
    return reach.filter(Run.objects, owner_field="owner")


def archived_run_get(*, reach: Reach, run_id: str) -> ArchivedRun | None:
    """The tombstone of a run retention archived (``ArchivedRun``, whose ``owner`` is the run's),
    if ``reach`` could have read that run; else None.
    Asked only after the run itself was not found, so a live run costs nothing more: the API
    (``saga_admin.api.common.archived_instead``, with the key's reach for reading: a run gone to
    its archive takes no writes from anyone, and saying so tells a caller nothing a read would
    not) and the dashboard answer 410 with it instead of 404; anyone else gets the 404 of a run
    that never existed."""
    return reach.first(ArchivedRun.objects, run_id, owner_field="owner")


def run_reference_for_write(*, key: AgentKey, run_id: str) -> Run:
    """A reference (not a read) to the run ``key`` writes to as its agent, for a service that locks
    the row itself: ``ledger.services.runs.run_lock`` narrows the lock to the reference's reach
    (``Reach.of_reference``: its tenant and owner), so another tenant's or another agent's run is
    not found there."""
    return Run(pk=run_id, tenant=key.tenant, owner=_writer(key))


def action_reference_for_write(*, key: AgentKey, action_id: str) -> Action:
    """A reference (not a read) to an action ``key`` reports on as its agent, for a service whose
    write scopes it itself (``ledger.services.actions.moves``: its tenant, and runs whose owner is the
    reference's ``owner``, the key's agent, ``Reach.of_key(write=True)``); out of reach, it is not
    found."""
    return Action(pk=action_id, tenant=key.tenant, owner=_writer(key))


def _writer(key: AgentKey) -> str:
    """The owner a key writes as (``ledger.scoping``'s owner rule: always its own agent)."""
    owner = Reach.of_key(key, write=True).owner
    assert owner is not None
    return owner


def checkpoints_for_run(*, run: Run) -> QuerySet[Checkpoint]:
    """A run's checkpoints, newest first: the order every list of them and "the latest" use."""
    return Checkpoint.objects.filter(run=run).order_by("-created_at", "-id")


def checkpoint_latest(*, run: Run) -> Checkpoint | None:
    return checkpoints_for_run(run=run).first()


# A run's actions in the order they were recorded (``seq`` is unique per run; the id breaks no tie
# but keeps the paginator's rule that the last key is the unique id).
ACTIONS_IN_ORDER: tuple[Key, ...] = (("seq", False), ("id", False))
# How many actions a run's detail shows: its newest, the rest are paged (``run_actions_page``).
RUN_DETAIL_ACTIONS = 100


def run_actions_newest(*, run: Run, limit: int = RUN_DETAIL_ACTIONS) -> tuple[list[Action], bool]:
    """The run's newest ``limit`` actions in ``seq`` order, and whether it has older ones. One
    query (one row more than shown), whatever the run's length."""
    rows = list(Action.objects.filter(run=run).order_by("-seq")[: limit + 1])
    return rows[:limit][::-1], len(rows) > limit


def run_actions_page(*, run: Run, cursor: str | None, limit: int) -> Page[Action]:
    """A page of the run's actions, oldest first, after ``cursor`` (a forged one: 422)."""
    return keyset_page(Action.objects.filter(run=run), keys=ACTIONS_IN_ORDER, cursor=cursor, limit=limit)


def run_warnings(*, run: Run, actions: Iterable[Any] | None = None) -> list[dict[str, Any]]:
    """Pivot-order (``ledger.rules``) and unknown-outcome warnings for a run, from its actions.
    Without ``actions``, reads the few columns of only the actions a warning can concern (a pivot,
    a compensatable action, an unknown outcome), so a long run is not loaded whole."""
    if actions is None:
        # Not ``run.actions``: the related manager would read each row's deferred run_id. A
        # compensatable action can be named only after a pivot, so only those after the first
        # irreversible action are read; and as rows of five columns, not model instances.
        first_irreversible = (
            Action.objects.filter(run_id=run.pk, action_class=ActionClass.EXTERNAL_IRREVERSIBLE)
            .exclude(status=Action.Status.REJECTED)
            .order_by("seq")
            .values("seq")[:1]
        )
        actions = (
            Action.objects.filter(run_id=run.pk)
            .filter(
                Q(action_class=ActionClass.EXTERNAL_IRREVERSIBLE)
                | Q(status=Action.Status.UNKNOWN)
                | Q(action_class__in=COMPENSATABLE_CLASSES, seq__gt=Subquery(first_irreversible))
            )
            .exclude(status=Action.Status.REJECTED)
            .order_by("seq")
            .values_list("pk", "seq", "tool", "status", "action_class", named=True)
        )
    ordered = sorted(actions, key=lambda a: a.seq)
    warnings: list[dict[str, Any]] = []
    pivot: Any = None
    for action in ordered:
        if action.status == Action.Status.REJECTED:
            continue
        if pivot is None and is_pivot(action.action_class, action.status):
            pivot = action
        elif pivot is not None and action.action_class in COMPENSATABLE_CLASSES:
            warnings.append(
                pivot_order_warning(
                    action_id=action.pk,
                    tool=action.tool,
                    seq=action.seq,
                    pivot_id=pivot.pk,
                    pivot_tool=pivot.tool,
                    pivot_seq=pivot.seq,
                )
            )
        if action.status == Action.Status.UNKNOWN:
            warnings.append(
                {
                    "code": "outcome_unknown",
                    "action_id": action.pk,
                    "message": (
                        f"{action.tool} (#{action.seq}) timed out and may have happened; reconcile it "
                        "(confirm done or not done) before resuming or compensating."
                    ),
                }
            )
    return warnings
