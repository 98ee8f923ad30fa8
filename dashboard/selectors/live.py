"""The run page, live: one poll that sends back only the regions whose state changed.

The page carries a fingerprint ("mark") of each region it shows (header, the decision notice,
the resume-wait panel, recovery item, unwind, pending approvals, ledger, audit log, the nav
badge). The poll sends them back; the answer is
204 when nothing changed, otherwise the new poller plus an out-of-band swap of each changed
region. Regions that hold what a person types (the open decision panels) are never swapped,
only emptied when their decision is no longer possible. Polling is fast while something is in
flight, slow while the run waits for a decision, and stops once the run is settled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Max
from django.utils.http import urlencode

from dashboard.permissions import Someone
from dashboard.selectors import inbox
from infra.durations import ago_words
from ledger.models import Action, Event, Run
from recovery.actions import commands
from recovery.decisions import RunDecisions, decisions_for
from recovery.models import Approval, RecoveryItem, Unwind
from recovery.unwinds.state import STOPPABLE

REGIONS = ("header", "notices", "resume", "item", "unwind", "approvals", "actions", "audit", "nav")
FAST = "2s"  # something is in flight: a compensation, a running agent, an approval
SLOW = "10s"  # the run waits for a person's decision (someone else may take it)


def _mark(*parts: Any) -> str:
    return hashlib.sha1(repr(parts).encode(), usedforsecurity=False).hexdigest()[:12]


@dataclass(frozen=True)
class Live:
    marks: dict[str, str]
    interval: str  # "" once the run is settled: no more polling
    decisions: RunDecisions
    upto: int  # the newest action the page shows
    item_id: str  # the item the page shows ("" for none)

    def query(self) -> str:
        query: dict[str, str | int] = {**self.marks, "upto": self.upto, "item_id": self.item_id}
        return urlencode(query)


def nav_badge(*, user: Someone) -> str:
    """The Approvals badge's text ("0" shows no badge); the nav's one definition."""
    count = inbox.approvals_pending_count(user=user)
    return f"{inbox.APPROVAL_BADGE_CAP}+" if count > inbox.APPROVAL_BADGE_CAP else str(count)


def live_state(
    *,
    run: Run,
    item: RecoveryItem | None,
    unwind: Unwind | None,
    approvals: list[Approval],
    user: Someone,
    upto: int,
) -> Live:
    steps = list(unwind.steps.all()) if unwind is not None else []
    actions = Action.objects.filter(run_id=run.pk).aggregate(n=Count("pk"), at=Max("updated_at"))
    last_event = Event.objects.filter(run_id=run.pk).aggregate(last=Max("pk"))["last"]
    unwind_state = (unwind.pk, unwind.status, unwind.updated_at) if unwind is not None else None
    step_states = [(s.pk, s.status, s.attempts, s.updated_at) for s in steps]
    item_state = (
        (item.pk, item.status, item.updated_at, item.assignee_id, item.resolution)
        if item is not None
        else None
    )
    wait = commands.resume_waiting(run=run)
    marks = {
        "header": _mark(run.status, run.finished_at, run.error, item_state),
        # The notice after a decision tells the state it left the run in: it follows the run's
        # status and whether a resume is still waiting for its agent, not the item's assignee.
        "notices": _mark(run.status, wait.command.pk if wait else None),
        "resume": _resume_mark(run, wait),
        "item": _mark(item_state, unwind_state, step_states),
        "unwind": _mark(unwind_state, step_states),
        "approvals": _mark([a.pk for a in approvals]),
        "actions": _mark(actions["n"], actions["at"]),
        "audit": _mark(last_event),
        "nav": _mark(nav_badge(user=user)),
    }
    in_flight = (
        run.status in (Run.Status.RUNNING, Run.Status.COMPENSATING)
        or (unwind is not None and unwind.status in STOPPABLE)
        or bool(approvals)
    )
    waiting = item is not None and item.status in RecoveryItem.UNRESOLVED
    return Live(
        marks=marks,
        interval=FAST if in_flight else SLOW if waiting else "",
        decisions=decisions_for(run=run, item=item, unwind=unwind),
        upto=upto,
        item_id=item.pk if item is not None else "",
    )


def _resume_mark(run: Run, wait: commands.ResumeWait | None) -> str:
    """What the resume-wait panel says: which command, how long it waited and the agent has been
    silent (in the words shown), whether it is overdue, heard from, pushed."""
    if wait is None:
        return _mark(None)
    pulse = commands.agent_pulse(run=run)
    return _mark(
        wait.command.pk,
        ago_words(wait.waited_s),
        wait.overdue,
        wait.heard_since,
        wait.command.delivered_at,
        pulse.heard_at,
        ago_words(pulse.silent_s),
    )


def changed_regions(live: Live, shown: dict[str, str]) -> set[str]:
    """The regions whose mark differs from the one the page showed."""
    return {region for region in REGIONS if shown.get(region) != live.marks[region]}
