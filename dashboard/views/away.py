"""The away page: an approver says until when they are away from a tenant and who covers for them
there, or that they are back (``recovery.actions.away``). These views only parse, check the role
and call it; a refusal is the page again with the service's sentence (422, 403), nothing changed."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from dashboard.away_form import AwayForm
from dashboard.permissions import Capability, can, tenants_for
from dashboard.selectors import away as away_selectors
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from ledger.away import AWAY_MAX
from ledger.models import Tenant
from recovery.actions import away as away_actions


def _context(
    request: HtmxHttpRequest, form: AwayForm, tenants: list[Tenant], error: str = ""
) -> dict[str, Any]:
    assert isinstance(request.user, User)
    aways = away_selectors.own_aways(request.user)
    return {
        "form": form,
        "error": error,
        "tenants": [
            {
                "tenant": tenant,
                "away": aways.get(tenant.pk),
                "choices": choices,
            }
            for tenant, choices in away_selectors.delegate_choices(request.user, tenants)
        ],
        "several_tenants": len(tenants) > 1,
        "away_max_days": AWAY_MAX.days,
        "can_set": bool(tenants),
    }


def _approving_tenants(request: HtmxHttpRequest) -> list[Tenant]:
    return [t for t in tenants_for(request.user) if can(request.user, Capability.APPROVE, t.pk)]


@require_http_methods(["GET", "POST"])
@login_required
def away(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the page. POST: set away (``tenant``, ``away_until`` in UTC, ``delegate``: a username),
    or, with ``back``, say you are back in ``tenant``."""
    tenants = _approving_tenants(request)
    if request.method != "POST":
        return render(request, "dashboard/away.html", _context(request, AwayForm(tenants=tenants), tenants))
    if not tenants:
        raise PermissionDenied("Your role cannot approve, so nothing goes to you for someone to cover.")
    assert isinstance(request.user, User)
    if "back" in request.POST:
        return _back(request, tenants)
    form = AwayForm(request.POST, tenants=tenants)
    if not form.is_valid():
        return render(
            request,
            "dashboard/away.html",
            _context(request, form, tenants, common.form_errors(form)),
            status=422,
        )
    tenant = next(t for t in tenants if t.pk == form.cleaned_data["tenant"])
    username = form.cleaned_data["delegate"].strip()
    delegate = get_user_model().objects.filter(username=username).first()
    if delegate is None:
        # The service's sentence for anyone who is no approver here: whether such a user exists
        # elsewhere does not show.
        error = (
            f"{username} is not an active approver or admin of {tenant.slug}, so they cannot cover "
            "for you: choose one of its approvers."
        )
        return render(request, "dashboard/away.html", _context(request, form, tenants, error), status=422)
    try:
        done = away_actions.away_set(
            user=request.user,
            tenant=tenant,
            until=form.cleaned_data["away_until"],
            delegate=delegate,
            actor=common.actor(request),
        )
    except SagaError as exc:
        return render(
            request, "dashboard/away.html", _context(request, form, tenants, exc.message), status=exc.status
        )
    handed = f" {done.handed_over} escalated approval(s) went to them now." if done.handed_over else ""
    until = done.membership.away_until
    messages.success(
        request,
        f"You are away from {tenant.slug} until {until:%Y-%m-%d %H:%M} UTC; approvals "
        f"escalated to you go to {delegate.get_username()}.{handed}",
    )
    return HttpResponseRedirect(reverse("dashboard:approvals"), status=303)


def _back(request: HtmxHttpRequest, tenants: list[Tenant]) -> HttpResponse:
    assert isinstance(request.user, User)
    raw = request.POST.get("tenant", "")
    tenant = next((t for t in tenants if raw.isdigit() and t.pk == int(raw)), None)
    if tenant is None:
        form = AwayForm(tenants=tenants)
        error = "Choose one of the tenants you approve in."
        return render(request, "dashboard/away.html", _context(request, form, tenants, error), status=422)
    if away_actions.away_clear(user=request.user, tenant=tenant, actor=common.actor(request)):
        messages.success(
            request,
            f"You are back in {tenant.slug}. What went to your delegate stays with them; you may decide it too.",
        )
    else:
        messages.info(request, f"You were not away from {tenant.slug}.")
    return HttpResponseRedirect(reverse("dashboard:away"), status=303)
