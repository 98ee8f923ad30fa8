"""The run page's reads: the run, its ledger, newest checkpoints and audit events (bounded, with
how many older ones there are), its recovery item, latest unwind with its steps, and pending
approvals. Every read is scoped to the user's tenants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Case, Prefetch, Value, When

from dashboard import permissions
from dashboard.permissions import Someone
from ledger.models import Action, Checkpoint, Event, Run
from ledger.selectors import checkpoints_for_run, run_warnings
from recovery.approvals import pending_q
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from recovery.trail import run_trail

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


def newest_checkpoints(*, run: Run, limit: int = RUN_PAGE_CHECKPOINTS) -> tuple[list[Checkpoint], int]:
    """The newest ``limit`` checkpoints (newest first) and how many older ones are not in it."""
    checkpoints = list(checkpoints_for_run(run=run)[:limit])
    older = checkpoints_for_run(run=run).count() - limit if len(checkpoints) == limit else 0
    return checkpoints, older


def run_for_user(*, user: Someone, run_id: str) -> Run | None:
    return (
        Run.objects.select_related("tenant", "failed_action")
        .filter(pk=run_id, tenant_id__in=permissions.tenant_ids_for(user))
        .first()
    )


def unwind_with_steps(*, unwind_id: str, tenant_ids: list[int]) -> Unwind | None:
    return (
        Unwind.objects.select_related("run", "tenant", "requested_by")
        .prefetch_related(
            Prefetch(
                "steps", queryset=UnwindStep.objects.select_related("action", "approval").order_by("position")
            )
        )
        .filter(pk=unwind_id, tenant_id__in=tenant_ids)
        .first()
    )


def run_actions(*, run: Run) -> list[Action]:
    """The run's ledger, in the order it was written."""
    return list(Action.objects.filter(run=run).order_by("seq"))


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
    return unwind_with_steps(unwind_id=latest, tenant_ids=[run.tenant_id]) if latest else None


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


def run_page(*, run: Run) -> RunPage:
    actions = run_actions(run=run)
    checkpoints, older_checkpoints = newest_checkpoints(run=run)
    events, older_events = run_events(run=run)
    return RunPage(
        run=run,
        actions=actions,
        warnings=run_warnings(run=run, actions=actions),
        checkpoints=checkpoints,
        events=events,
        item=run_item(run=run),
        unwind=run_latest_unwind(run=run),
        approvals=run_pending_approvals(run=run),
        trail=run_trail(run=run),
        older_checkpoints=older_checkpoints,
        older_events=older_events,
    )
