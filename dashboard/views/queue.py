"""The recovery queue: its filters, keyset pages and groups of similar failures, the auto-refresh
poll that counts new items, and bulk close / compensate of selected items."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HTMX_STOP_POLLING

from dashboard import saved_filters
from dashboard.forms import BulkForm, QueueFilterForm
from dashboard.models import SavedFilter
from dashboard.permissions import Capability, require, tenant_ids_with, tenants_for
from dashboard.selectors import queue as queue_selectors
from dashboard.selectors import runs_list as runs_selectors
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.conf import saga
from infra.errors import SagaError
from ledger.models import Risk, Run, Tenant
from recovery.actions import bulk
from recovery.models import RecoveryItem


def _queue_view(
    request: HttpRequest, tenants: list[Tenant]
) -> tuple[QueueFilterForm, queue_selectors.QueueView]:
    form = QueueFilterForm(request.GET or None, tenants=tenants)
    if not request.GET:
        return form, queue_selectors.QueueView()
    return form, form.view()


def _run_outside_queue(
    request: HttpRequest, view: queue_selectors.QueueView, page: queue_selectors.QueuePage
) -> Run | None:
    """A search that finds nothing in the queue may still name a run outside it (running,
    succeeded, already decided): the page says so and links to it instead of only "nothing"."""
    if not view.queue_filter.search or page.items or request.GET.get("cursor"):
        return None
    return runs_selectors.run_named_exactly(user=request.user, term=view.queue_filter.search)


def _saved_and_counts(
    request: HtmxHttpRequest, tenants: list[Tenant], view: queue_selectors.QueueView
) -> dict[str, object]:
    """The user's saved filters with their counts, and what waits by reason and by risk (one
    grouped query), each choice a link that keeps the rest of the current filter."""
    current = view.as_query()
    facets = queue_selectors.queue_facets(user=request.user)

    def choice_links(field: str, counts: dict[str, int], labels: dict[str, str]) -> list[dict[str, object]]:
        return [
            {
                "label": labels.get(value, value),
                "count": n,
                "query": urlencode({**current, field: value}),
                "current": current.get(field) == value,
            }
            for value, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ]

    return {
        "saved_filters": saved_filters.saved_filter_links(
            user=request.user, tenants=tenants, current_query=urlencode(current)
        ),
        "saved_name_max": SavedFilter.NAME_MAX_LENGTH,
        "facet_total": facets.total,
        "reason_links": choice_links("reason", facets.reasons, dict(RecoveryItem.Reason.choices)),
        "risk_links": choice_links("risk", facets.risks, dict(Risk.choices)),
    }


def _selectable(item: RecoveryItem, operable: set[int]) -> bool:
    """An item the ticked bulk takes (``recovery.actions.bulk``), in a tenant the user operates."""
    return bulk.ticked_bulk_takes(item) and item.tenant_id in operable


@require_GET
@login_required
def queue(request: HtmxHttpRequest) -> HttpResponse:
    tenants = tenants_for(request.user)
    form, view = _queue_view(request, tenants)
    page = queue_selectors.queue_page(user=request.user, view=view, cursor=request.GET.get("cursor", ""))
    operable = set(tenant_ids_with(request.user, Capability.OPERATE))
    load_more = bool(request.htmx and request.htmx.target == "load-more")
    # The groups panel aggregates every matching item: not for "load more" (only rows are sent
    # back), nor while searching (a search looks for particular runs, and its substring match
    # would be paid a second time for a panel about the whole queue).
    show_groups = not load_more and not view.queue_filter.search
    # "Decide all N matching…": for a filter that narrows the queue, over what the user operates on.
    bulk_count = (
        view.queue_filter.items(tenants=operable).count()
        if operable and not load_more and page.items and not view.queue_filter.is_empty()
        else 0
    )
    context = {
        "form": form,
        "queue_filter": view.queue_filter,
        "filter_query": urlencode(view.as_query()),
        "page": page,
        "groups": queue_selectors.queue_groups(user=request.user, view=view) if show_groups else [],
        "operable_tenant_ids": operable,
        # The rows with a checkbox for the ticked bulk: the bar shows only when there is something
        # to tick (or a next page that may have some).
        "selectable_ids": {item.pk for item in page.items if _selectable(item, operable)},
        "bulk_max": saga().bulk_max_items,
        "bulk_count": bulk_count,
        "sla_minutes": saga().queue_sla_minutes,
        "since": page.read_at.isoformat() if page.read_at else "",
        "paged": bool(request.GET.get("cursor")),
        "polling": True,
        "run_outside_queue": _run_outside_queue(request, view, page),
    }
    if not load_more:
        context.update(_saved_and_counts(request, tenants, view))
    if load_more:
        return render(request, "dashboard/queue.html#queue-rows", context)
    if request.htmx and request.htmx.target == "queue-results":
        return render(request, "dashboard/queue.html#queue-results", context)
    return render(request, "dashboard/queue.html", context)


@require_GET
@login_required
def queue_new(request: HtmxHttpRequest) -> HttpResponse:
    """The auto-refresh poll: how many items arrived since the page was rendered, without
    touching the list the operator is reading."""
    tenants = tenants_for(request.user)
    _form, view = _queue_view(request, tenants)
    try:
        since = parse_datetime(request.GET.get("since", ""))
    except ValueError:
        # Well-formed but impossible ("2026-13-45…"): treat like no reference time.
        since = None
    count = queue_selectors.queue_new_count(user=request.user, view=view, since=since) if since else 0
    context = {
        "new_count": count,
        "capped": count > queue_selectors.NEW_ITEMS_CAP,
        "cap": queue_selectors.NEW_ITEMS_CAP,
        "since": since.isoformat() if since else "",
        "filter_query": urlencode(view.as_query()),
        "polling": since is not None and count <= queue_selectors.NEW_ITEMS_CAP,
    }
    response = render(request, "dashboard/queue.html#new-items", context)
    if not context["polling"]:
        # Past the cap (or without a reference time) further polls cannot tell the operator more.
        response.status_code = HTMX_STOP_POLLING
    return response


@require_POST
@login_required
def queue_bulk(request: HtmxHttpRequest) -> HttpResponse:
    back = reverse("dashboard:queue")
    form = BulkForm(request.POST)
    ids = list(dict.fromkeys(request.POST.getlist("items")))
    if not form.is_valid() or not ids:
        messages.error(request, common.form_errors(form) if form.errors else "Select at least one item.")
        return common.done(request, back)
    items = queue_selectors.items_for_user(user=request.user, ids=ids)
    if len(items) != len(ids):
        raise Http404("Some selected items do not exist.")
    for item in items:
        require(request.user, Capability.OPERATE, item.tenant_id)
    operation = form.cleaned_data["operation"]
    service = bulk.items_bulk_close if operation == "close" else bulk.items_bulk_compensate
    try:
        outcomes = service(items=items, actor=common.actor(request), reason=form.cleaned_data["reason"])
    except SagaError as exc:
        return common.refused(request, exc, back)
    done = [o for o in outcomes if o.ok]
    if done:
        verb = "Closed" if operation == "close" else "Started compensation for"
        messages.success(request, f"{verb} {len(done)} item{'s' if len(done) != 1 else ''}.")
    for outcome in outcomes:
        if not outcome.ok:
            messages.error(request, f"{outcome.item_id}: {outcome.sentence or outcome.message}")
    return common.done(request, back)
