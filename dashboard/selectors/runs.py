"""The run page's reads: the run, its ledger, newest checkpoints and audit events (bounded, with
how many older ones there are), its recovery item, latest unwind with its steps, and pending
approvals. Every read is narrowed to the user's reach (their tenants, ``ledger.scoping``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, Prefetch, Value, When

from infra.pagination import Key, Page, cursor_after, keyset_page
from ledger.models import Action, Checkpoint, Event, Run
from ledger.scoping import Reach
from ledger.selectors import checkpoints_for_run, run_warnings
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from recovery.transitions.approvals import pending_q

# A run page shows the newest checkpoints and audit events and says how many older ones there are:
# an agent that checkpoints in a loop must not make the operator's page unbounded.
RUN_PAGE_CHECKPOINTS = 20
RUN_PAGE_EVENTS = 200


@dataclass
class RunPage:
    run: Run
    actions: list[Action]
    warnings: list[dict[str, str]]
    checkpoints: list[Checkpoint]
    events: list[Event]
    item: RecoveryItem | None
    unwind: Unwind | None
    approvals: list[Approval] = field(default_factory=list)
    trail: Any = None
    older_checkpoints: int = 0  # not shown: older than the newest RUN_PAGE_CHECKPOINTS
    older_events: int = 0  # not shown: older than the newest RUN_PAGE_EVENTS
    older_actions: str = ""  # the cursor of the page of actions before those shown ("" for none)


def newest_checkpoints(*, run: Run, limit: int = RUN_PAGE_CHECKPOINTS) -> tuple[list[Checkpoint], int]:
    """The newest ``limit`` checkpoints (newest first) and how many older ones are not in it."""
    checkpoints = list(checkpoints_for_run(run=run)[:limit])
    older = checkpoints_for_run(run=run).count() - limit if len(checkpoints) == limit else 0
    return checkpoints, older


def page_run(*, reach: Reach, run_id: str) -> Run | None:
    """The run a run page shows, if it is within ``reach`` (``dashboard.permissions.reach_for``)."""
    return reach.first(Run.objects.select_related("tenant", "failed_action"), run_id, owner_field="owner")


def unwind_with_steps(*, reach: Reach, unwind_id: str) -> Unwind | None:
    return reach.first(
        Unwind.objects.select_related("run", "tenant", "requested_by").prefetch_related(
            Prefetch(
                "steps", queryset=UnwindStep.objects.select_related("action", "approval").order_by("position")
            )
        ),
        unwind_id,
    )


# The run page's actions, newest first in keyset pages (``seq`` is unique within a run): the newest
# page is served with the page, each older one by its "Load more".
ACTIONS_NEWEST_FIRST: tuple[Key, ...] = (("seq", True),)
RUN_PAGE_ACTIONS = 50


def run_actions_page(*, run: Run, cursor: str | None, limit: int | None = None) -> Page[Action]:
    """A page of the run's actions before ``cursor`` (newest first; the template shows them in
    the order they were written), one query whatever the run's length. A cursor the page did not
    hand out is a ``ValidationFailed``."""
    return keyset_page(
        Action.objects.filter(run=run),
        keys=ACTIONS_NEWEST_FIRST,
        cursor=cursor,
        limit=limit or RUN_PAGE_ACTIONS,
    )


def actions_cursor_through(*, seq: int) -> str:
    """The cursor of the page whose newest action is ``seq`` (a link to an older action's card)."""
    return cursor_after([seq + 1])


def latest_undo_steps(*, actions: list[Action]) -> dict[str, UnwindStep]:
    """Each action's newest undo step, by action id, for the actions whose policy takes images
    (their steps carry the reads, ``UnwindStep.read_checks``): one query for a page of actions."""
    ids = [a.pk for a in actions if isinstance(a.policy, dict) and a.policy.get("before")]
    if not ids:
        return {}
    steps = (
        UnwindStep.objects.filter(action_id__in=ids)
        .order_by("action_id", "-created_at")
        .distinct("action_id")
    )
    return {step.action_id: step for step in steps}


def run_item(*, run: Run) -> RecoveryItem | None:
    """The run's item the page shows: the unresolved one, else the newest resolved one."""
    return (
        RecoveryItem.objects.filter(run=run)
        .select_related("assignee", "claimed_by", "resolved_by", "failed_action")
        .order_by(
            Case(When(status__in=RecoveryItem.UNRESOLVED, then=Value(0)), default=Value(1)), "-opened_at"
        )
        .first()
    )


def run_latest_unwind(*, run: Run) -> Unwind | None:
    latest = Unwind.objects.filter(run=run).order_by("-created_at").values_list("pk", flat=True).first()
    return unwind_with_steps(reach=Reach.of_tenants([run.tenant_id]), unwind_id=latest) if latest else None


def run_pending_approvals(*, run: Run) -> list[Approval]:
    return list(
        Approval.objects.filter(pending_q(), run=run)
        .select_related("action")
        .prefetch_related("grants")
        .order_by("created_at")
    )


def run_events(*, run: Run) -> tuple[list[Event], int]:
    """The newest ``RUN_PAGE_EVENTS`` audit events, oldest first, and how many older ones."""
    events = list(Event.objects.filter(run=run).order_by("-id")[:RUN_PAGE_EVENTS])[::-1]
    older = Event.objects.filter(run=run).count() - RUN_PAGE_EVENTS if len(events) == RUN_PAGE_EVENTS else 0
    return events, older


def run_page(*, run: Run, cursor: str | None = None) -> RunPage:
    """The run page's reads: one page of the ledger (the newest, or the one before ``cursor``),
    never the whole of it; warnings from the few columns of the actions they can concern."""
    actions = run_actions_page(run=run, cursor=cursor)
    checkpoints, older_checkpoints = newest_checkpoints(run=run)
    events, older_events = run_events(run=run)
    return RunPage(
        run=run,
        actions=actions.items[::-1],
        older_actions=actions.next_cursor or "",
        warnings=run_warnings(run=run),
        checkpoints=checkpoints,
        events=events,
        item=run_item(run=run),
        unwind=run_latest_unwind(run=run),
        approvals=run_pending_approvals(run=run),
        older_checkpoints=older_checkpoints,
        older_events=older_events,
    )
