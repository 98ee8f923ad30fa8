"""Saved queue filters (``dashboard.saved_filters``): save the queue's current filter under a
name, rename or delete one of your own. Each answers with a message and the queue."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard import saved_filters
from dashboard.models import SavedFilter
from dashboard.permissions import tenants_for
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra import errors


def _queue(query: str = "") -> str:
    return reverse("dashboard:queue") + (f"?{query}" if query else "")


def _own(request: HtmxHttpRequest, pk: int) -> SavedFilter:
    try:
        return saved_filters.saved_filter_get(user=request.user, pk=pk)
    except errors.NotFound as exc:
        raise Http404(exc.message) from exc


@require_POST
@login_required
def saved_filter_create(request: HtmxHttpRequest) -> HttpResponse:
    query = str(request.POST.get("query", ""))
    try:
        saved = saved_filters.saved_filter_create(
            user=request.user,
            name=str(request.POST.get("name", "")),
            query=query,
            tenants=tenants_for(request.user),
        )
    except errors.ValidationFailed as exc:
        messages.error(request, exc.message)
        return common.done(request, _queue(query[: SavedFilter.QUERY_MAX_LENGTH]))
    messages.success(request, f"Saved the filter “{saved.name}”.")
    return common.done(request, _queue(saved.query))


@require_POST
@login_required
def saved_filter_rename(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    saved = _own(request, pk)
    try:
        saved = saved_filters.saved_filter_rename(saved=saved, name=str(request.POST.get("name", "")))
    except errors.ValidationFailed as exc:
        messages.error(request, exc.message)
        return common.done(request, _queue())
    messages.success(request, f"Renamed the filter to “{saved.name}”.")
    return common.done(request, _queue())


@require_POST
@login_required
def saved_filter_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    saved = _own(request, pk)
    saved_filters.saved_filter_delete(saved=saved)
    messages.success(request, f"Deleted the filter “{saved.name}”.")
    return common.done(request, _queue())
