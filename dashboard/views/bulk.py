"""Bulk decisions by filter: from the queue's filter bar to a preview (counts by risk and reason, a
sample, how many compensations would wait for an approver), the decision with a typed
confirmation past a threshold, and the bulk's page (live progress, what was decided, skipped or
refused, abort). The decisions are ``recovery.actions.bulk_filter``'s."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HTMX_STOP_POLLING

from dashboard.forms import BulkByFilterForm, QueueFilterForm, ReasonForm
from dashboard.permissions import Capability, TenantPermissions, require, tenant_ids_with, tenants_for
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.conf import saga
from infra.errors import SagaError
from ledger.models import Tenant
from recovery import selectors
from recovery.actions import bulk_filter
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.selectors import QueueFilter

SHOWN_PER_OUTCOME = 50


def _tenant_for_bulk(request: HttpRequest, queue_filter: QueueFilter) -> Tenant | None:
    """The one tenant a bulk decides in: the filter's, or the only one the user operates in."""
    operable = [
        t for t in tenants_for(request.user) if t.pk in set(tenant_ids_with(request.user, Capability.OPERATE))
    ]
    if queue_filter.tenant_slug:
        chosen = [t for t in operable if t.slug == queue_filter.tenant_slug]
        return chosen[0] if chosen else None
    return operable[0] if len(operable) == 1 else None


@require_http_methods(["GET", "POST"])
@login_required
def bulk_preview(request: HtmxHttpRequest) -> HttpResponse:
    """GET: what the queue's filter (the same query string) matches now; POST: start the bulk."""
    tenants = tenants_for(request.user)
    filter_form = QueueFilterForm(request.GET, tenants=tenants)
    view = filter_form.view()
    queue_filter = view.queue_filter
    back = reverse("dashboard:queue") + (f"?{urlencode(view.as_query())}" if view.as_query() else "")
    if filter_form.errors:
        # The queue shows a value it does not accept as an error and lists without it; a bulk
        # never decides on the wider filter that leaves: the operator corrects the filter first.
        messages.error(
            request, f"Correct the filter before deciding in bulk: {common.form_errors(filter_form)}"
        )
        return common.done(request, reverse("dashboard:queue") + f"?{request.GET.urlencode()}")
    tenant = _tenant_for_bulk(request, queue_filter)
    if tenant is None:
        messages.error(
            request, "Choose the tenant to decide in (Tenant in the filter bar), one you operate in."
        )
        return common.done(request, back)
    require(request.user, Capability.OPERATE, tenant.pk)
    threshold = saga().bulk_confirm_threshold
    form = BulkByFilterForm(request.POST or None, threshold=threshold)
    if request.method == "POST" and form.is_valid():
        try:
            bulk = bulk_filter.bulk_start(
                tenant=tenant,
                queue_filter=queue_filter,
                action=form.cleaned_data["action"],
                reason=form.cleaned_data["reason"],
                actor=common.actor(request),
                expected_count=form.cleaned_data["expected_count"],
            )
        except bulk_filter.CountChanged as exc:
            messages.error(request, exc.message)
            return common.done(request, request.get_full_path())
        except SagaError as exc:
            return common.refused(request, exc, back)
        return common.done(request, reverse("dashboard:bulk-detail", args=[bulk.pk]))
    try:
        preview = bulk_filter.bulk_preview(
            tenant=tenant, queue_filter=queue_filter, action=BulkOperation.Action.COMPENSATE
        )
    except SagaError as exc:
        return common.refused(request, exc, back)
    if request.method == "GET":
        form = BulkByFilterForm(
            initial={"expected_count": preview.count, "action": "close"}, threshold=threshold
        )
    context = {
        "preview": preview,
        "form": form,
        "tenant": tenant,
        "queue_filter": queue_filter,
        "filter_query": urlencode(view.as_query()),
        "back": back,
        "threshold": threshold,
        "typed": preview.count > threshold,
    }
    return render(request, "dashboard/bulk_preview.html", context, status=422 if form.errors else 200)


def _bulk_context(request: HttpRequest, bulk: BulkOperation) -> dict[str, object]:
    return {
        "bulk": bulk,
        "filter": bulk_filter.filter_from_dict(bulk.filter),
        "percent": int(100 * bulk.decided / bulk.total) if bulk.total else 100,
        "decided": selectors.bulk_items(bulk=bulk, outcome=BulkItem.Outcome.DONE, limit=SHOWN_PER_OUTCOME),
        "skipped": selectors.bulk_items(bulk=bulk, outcome=BulkItem.Outcome.SKIPPED, limit=SHOWN_PER_OUTCOME),
        "allowed": TenantPermissions(request.user, bulk.tenant_id),
        "reason_form": ReasonForm(),
        "shown": SHOWN_PER_OUTCOME,
    }


@require_GET
@login_required
def bulk_detail(request: HtmxHttpRequest, bulk_id: str) -> HttpResponse:
    bulk = common.get_or_404(BulkOperation.objects.select_related("tenant"), bulk_id, request)
    context = _bulk_context(request, bulk)
    if request.htmx and request.htmx.target == "bulk-progress":
        response = render(request, "dashboard/bulk.html#bulk-progress", context)
        if bulk.status != BulkOperation.Status.RUNNING:
            response.status_code = HTMX_STOP_POLLING
        return response
    return render(request, "dashboard/bulk.html", context)


@require_POST
@login_required
def bulk_abort(request: HtmxHttpRequest, bulk_id: str) -> HttpResponse:
    bulk = common.get_or_404(BulkOperation.objects.select_related("tenant"), bulk_id, request)
    require(request.user, Capability.OPERATE, bulk.tenant_id)
    back = reverse("dashboard:bulk-detail", args=[bulk.pk])
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, common.form_errors(form))
        return common.done(request, back)
    try:
        bulk_filter.bulk_abort(bulk=bulk, actor=common.actor(request), reason=form.cleaned_data["reason"])
    except SagaError as exc:
        return common.refused(request, exc, back)
    messages.success(request, "Aborted: no further item is started. The decisions already made stand.")
    return common.done(request, back)
