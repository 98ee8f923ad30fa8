"""What every dashboard view shares: the request type (htmx's details on it), who is acting, the
answer after a decision (a 303, or htmx's client-side redirect) or a refusal (a message, never a
500), a form's errors in one line, the run page's address, an object looked up within the user's
reach only (``get_or_404``: their tenants, 404 otherwise) and a confirmation page (or its htmx
partial)."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import messages
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect, HttpResponseClientRefresh
from django_htmx.middleware import HtmxDetails

from dashboard.permissions import reach_for
from infra.errors import SagaError
from ledger import selectors as ledger_selectors
from ledger.audit import Actor
from recovery import decisions as recovery_decisions

M = TypeVar("M", bound=Model)


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


def actor(request: HttpRequest) -> Actor:
    # Every view that decides is behind login_required: the user is a real one.
    assert request.user.is_authenticated
    return Actor.for_user(request.user)


def done(request: HtmxHttpRequest, url: str) -> HttpResponse:
    """After a decision: a 303 to ``url`` (or, for htmx, a client-side redirect there)."""
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url, status=303)


def refused(request: HtmxHttpRequest, exc: SagaError, url: str) -> HttpResponse:
    """A domain error (conflict, invalid transition, self-approval …) is a message, never a 500,
    and a sentence, never the exception's text (``recovery.decisions.refusal_sentence``)."""
    messages.error(request, recovery_decisions.refusal_sentence(exc))
    return done(request, url)


def form_errors(form: Any) -> str:
    # Every message names its field already ("A reason is required.", "Not valid JSON: …").
    return " ".join(str(error) for errors in form.errors.values() for error in errors)


def run_url(run_id: str, anchor: str = "") -> str:
    return reverse("dashboard:run-detail", args=[run_id]) + (f"#{anchor}" if anchor else "")


def get_or_404(queryset: QuerySet[M], pk: str, request: HttpRequest, *, tenant_field: str = "tenant_id") -> M:
    """The object if it is within the user's reach (``permissions.reach_for``: one of their
    tenants); otherwise 404, so it does not leak."""
    obj = reach_for(request.user).first(queryset, pk, tenant_field=tenant_field)
    if obj is None:
        raise Http404(f"No such {queryset.model._meta.verbose_name}.")
    return obj


def run_missing(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The answer for a run page (or a decision about a run) whose run is not in the user's
    tenants: 410 with where its archive is and how to verify it, when retention archived it in one
    of them (``ledger.selectors.archived_run_get``); otherwise 404, exactly as for a run that never
    existed. Only a missing run pays for the lookup. The run page's poll is told to reload the page."""
    archived = ledger_selectors.archived_run_get(reach=reach_for(request.user), run_id=run_id)
    if archived is None:
        raise Http404("No such run.")
    if request.htmx:
        return HttpResponseClientRefresh()
    context = {
        "archived": archived,
        "verify_command": f"python manage.py verify_audit --archive {archived.archive}",
    }
    return render(request, "dashboard/run_archived.html", context, status=410)


def render_preview(request: HtmxHttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    partial = f"{template}#preview" if request.htmx and not request.htmx.boosted else template
    return render(request, partial, context, status=422 if context["form"].errors else 200)
