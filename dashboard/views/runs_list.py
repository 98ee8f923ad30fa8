"""The Runs page: every run of the user's tenants (not only those in the queue), newest first in
keyset pages, filtered by agent, status, tool, start time and an id or text search. A search that
names exactly one run opens it. Cancel and Flag lead to the run's own confirmations
(``dashboard.views.runs``), offered only to those who may operate in the run's tenant."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils.http import urlencode
from django.views.decorators.http import require_GET

from dashboard.permissions import Capability, tenant_ids_with, tenants_for
from dashboard.run_filter_form import RunFilterForm
from dashboard.selectors import runs_list as runs_selectors
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from ledger.run_filter import RunFilter
from recovery.decisions import cancel_decision, flag_decision

# The query string's names the filter bar uses (links that keep the filters carry only these).
FILTER_FIELDS = ("q", "tenant", "agent", "status", "tool", "after", "before")


@require_GET
@login_required
def runs_list(request: HtmxHttpRequest) -> HttpResponse:
    tenants = tenants_for(request.user)
    form = RunFilterForm(request.GET or None, tenants=tenants)
    run_filter, problems = form.run_filter() if request.GET else (RunFilter(), [])
    page = runs_selectors.RunsPage()
    if not problems:
        page = runs_selectors.runs_list_page(
            user=request.user, run_filter=run_filter, cursor=request.GET.get("cursor", "")
        )
        if page.exact and len(page.runs) == 1 and not request.GET.get("cursor"):
            # An id names one run: open it, as the operator who pasted it wants.
            return common.done(request, common.run_url(page.runs[0].pk))
    operable = set(tenant_ids_with(request.user, Capability.OPERATE))
    rows = [
        {
            "run": run,
            "cancel": run.tenant_id in operable and bool(cancel_decision(run=run)),
            "flag": run.tenant_id in operable
            and bool(flag_decision(run=run, in_queue=getattr(run, "in_queue", False))),
        }
        for run in page.runs
    ]
    filter_query = urlencode(
        {name: request.GET[name] for name in FILTER_FIELDS if request.GET.get(name) and not problems}
    )
    context = {
        "form": form,
        "problems": problems,
        "page": page,
        "rows": rows,
        "filtered": bool(filter_query),
        "filter_query": filter_query,
        "paged": bool(request.GET.get("cursor")),
    }
    if request.htmx and request.htmx.target == "load-more":
        return render(request, "dashboard/runs.html#runs-rows", context)
    if request.htmx and request.htmx.target == "runs-results":
        return render(request, "dashboard/runs.html#runs-results", context)
    return render(request, "dashboard/runs.html", context)
