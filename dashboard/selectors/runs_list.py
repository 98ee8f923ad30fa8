"""The Runs page's reads: a keyset page of every run of the user's tenants that the one
``ledger.run_filter.RunFilter`` matches (newest first, one query for the rows whatever the page),
and the run a queue search names exactly, for the queue's "not in the queue" hint."""

from __future__ import annotations

from dataclasses import dataclass, field

from dashboard import permissions
from dashboard.permissions import Someone
from infra.conf import saga
from infra.errors import ValidationFailed
from ledger.models import Run
from ledger.run_filter import RunFilter, runs_page
from recovery.models import RecoveryItem


@dataclass
class RunsPage:
    runs: list[Run] = field(default_factory=list)
    next_cursor: str = ""
    # The search named these runs exactly (a run, external, action or target id).
    exact: bool = False
    # The cursor was not one the page handed out: the first page is shown instead.
    cursor_refused: bool = False


def runs_list_page(
    *, user: Someone, run_filter: RunFilter, cursor: str = "", page_size: int | None = None
) -> RunsPage:
    """A page of the runs the user sees that ``run_filter`` matches. Each run carries
    ``in_queue`` (whether it has an unresolved recovery item: one more query for the page),
    which decides whether Flag is offered (``recovery.decisions.flag_decision``)."""
    tenants = permissions.tenant_ids_for(user)
    size = page_size or saga().page_size
    refused = False
    try:
        page, exact = runs_page(tenants=tenants, run_filter=run_filter, cursor=cursor, limit=size)
    except ValidationFailed:
        # Only the cursor can be refused here (the filter was validated when it was built).
        refused = True
        page, exact = runs_page(tenants=tenants, run_filter=run_filter, cursor=None, limit=size)
    runs = page.items
    queued = (
        set(
            RecoveryItem.objects.filter(
                run_id__in=[r.pk for r in runs], status__in=RecoveryItem.UNRESOLVED
            ).values_list("run_id", flat=True)
        )
        if runs
        else set()
    )
    for run in runs:
        run.in_queue = run.pk in queued  # type: ignore[attr-defined]
    return RunsPage(runs=runs, next_cursor=page.next_cursor or "", exact=exact, cursor_refused=refused)


def run_named_exactly(*, user: Someone, term: str) -> Run | None:
    """The run ``term`` names exactly (a run, external, action or target id) among the user's
    tenants, when it names one; ``None`` for anything else (text, several runs, a value the
    filter refuses)."""
    try:
        run_filter = RunFilter(search=term)
    except ValidationFailed:
        return None
    if not run_filter.search:
        return None
    found = list(run_filter.exact_ids(tenants=permissions.tenant_ids_for(user)).select_related("tenant")[:2])
    return found[0] if len(found) == 1 else None
