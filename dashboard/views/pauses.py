"""The Pauses page: the kill switches in force and recently lifted, pausing an agent and/or a tool
(with a confirmation that says what will be refused) and lifting a pause. The services are
``ledger.services.pauses``; these views only parse, check the role and call them."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from dashboard.forms import PauseForm, ReasonForm
from dashboard.permissions import (
    Capability,
    can,
    reach_for,
    require,
    tenant_ids_for,
    tenant_ids_with,
    tenants_for,
)
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import NotFound, SagaError
from ledger.models import Pause, Tenant
from ledger.services import pauses as ledger_pauses

ACTIVE_SHOWN = 200
LIFTED_SHOWN = 20


def _pauses_url() -> str:
    return reverse("dashboard:pauses")


def _consequence(*, agent: str, tool: str) -> str:
    """What a pause of ``agent``/``tool`` refuses, in one sentence (the confirmation and the list)."""
    if agent and tool:
        return (
            f"New actions of tool {tool} in runs of agent {agent} are refused with 409 paused; "
            "the agent's runs still start and its other tools still work."
        )
    if agent:
        return (
            f"New runs of agent {agent} are refused with 409 paused, and so are new actions in the "
            "runs it already has going."
        )
    return f"New actions of tool {tool} are refused with 409 paused, in every run of every agent."


def _accepted_again(*, agent: str, tool: str) -> str:
    """What lifting a pause of ``agent``/``tool`` lets through again, in one sentence."""
    if agent and tool:
        what = f"New actions of tool {tool} in runs of agent {agent} are"
    elif agent:
        what = f"New runs of agent {agent}, and new actions in its runs, are"
    else:
        what = f"New actions of tool {tool} are"
    return f"{what} accepted again from the next request on."


def _page_context(request: HtmxHttpRequest, form: PauseForm, tenants: list[Tenant]) -> dict[str, Any]:
    seen = tenant_ids_for(request.user)
    active = ledger_pauses.pauses_list(tenant_ids=seen, status="active", limit=ACTIVE_SHOWN, strict=False)
    lifted = ledger_pauses.pauses_list(tenant_ids=seen, status="lifted", limit=LIFTED_SHOWN, strict=False)
    operable = set(tenant_ids_with(request.user, Capability.OPERATE))
    return {
        "form": form,
        "can_pause": bool(tenants),
        "several_tenants": len(seen) > 1,
        "active": [
            {
                "pause": p,
                "by": ledger_pauses.created_by_label(p),
                "consequence": _consequence(agent=p.agent, tool=p.tool),
                "can_lift": p.tenant_id in operable,
            }
            for p in active.items
        ],
        "active_more": active.next_cursor is not None,
        "lifted": [
            {
                "pause": p,
                "by": ledger_pauses.created_by_label(p),
                "lifted_by": ledger_pauses.lifted_by_label(p),
            }
            for p in lifted.items
        ],
    }


@require_http_methods(["GET", "POST"])
@login_required
def pauses(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the page. POST: a pause — first the confirmation (what will be refused, how many
    running runs match), then, with ``confirmed``, the pause itself."""
    tenants = [t for t in tenants_for(request.user) if can(request.user, Capability.OPERATE, t.pk)]
    form = PauseForm(request.POST or None, tenants=tenants)
    partial = "dashboard/pauses.html#pause-form" if request.htmx else "dashboard/pauses.html"
    if request.method != "POST":
        return render(request, "dashboard/pauses.html", _page_context(request, form, tenants))
    if not tenants:
        raise PermissionDenied("Your role cannot pause agents or tools.")
    if not form.is_valid() or "edit" in request.POST:
        status = 422 if form.errors else 200
        return render(request, partial, _page_context(request, form, tenants), status=status)
    tenant = next(t for t in tenants if t.pk == form.cleaned_data["tenant"])
    require(request.user, Capability.OPERATE, tenant.pk)
    agent, tool, reason = (form.cleaned_data[name] for name in ("agent", "tool", "reason"))
    if request.POST.get("confirmed") != "yes":
        context = _page_context(request, form, tenants)
        context["confirm"] = {
            "tenant": tenant,
            "agent": agent,
            "tool": tool,
            "reason": reason,
            "consequence": _consequence(agent=agent, tool=tool),
            "running": ledger_pauses.running_runs_covered(tenant=tenant, agent=agent, tool=tool),
            "glob": any(ch in agent + tool for ch in "*?["),
        }
        return render(request, partial, context)
    try:
        pause = ledger_pauses.pause_create(
            tenant=tenant, actor=common.actor(request), agent=agent, tool=tool, reason=reason
        )
    except SagaError as exc:
        return common.refused(request, exc, _pauses_url())
    messages.success(
        request,
        f"Paused {ledger_pauses.describe(pause)} ({pause.pk}). "
        f"{_consequence(agent=pause.agent, tool=pause.tool)}",
    )
    return common.done(request, _pauses_url())


def _get_pause_for_user(request: HtmxHttpRequest, pause_id: str) -> Pause:
    try:
        pause = ledger_pauses.pause_get(reach=reach_for(request.user), pause_id=pause_id)
    except NotFound:
        raise Http404("No such pause.") from None
    require(request.user, Capability.OPERATE, pause.tenant_id)
    return pause


@require_http_methods(["GET", "POST"])
@login_required
def pause_lift(request: HtmxHttpRequest, pause_id: str) -> HttpResponse:
    pause = _get_pause_for_user(request, pause_id)
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            ledger_pauses.pause_lift(
                pause=pause, actor=common.actor(request), reason=form.cleaned_data["reason"]
            )
        except SagaError as exc:
            return common.refused(request, exc, _pauses_url())
        messages.success(request, f"Lifted {pause.pk}. {_accepted_again(agent=pause.agent, tool=pause.tool)}")
        return common.done(request, _pauses_url())
    template = "dashboard/pause_lift.html"
    partial = f"{template}#preview" if request.htmx and not request.htmx.boosted else template
    context = {
        "pause": pause,
        "form": form,
        "what": ledger_pauses.describe(pause),
        "by": ledger_pauses.created_by_label(pause),
        "accepted_again": _accepted_again(agent=pause.agent, tool=pause.tool),
    }
    return render(request, partial, context, status=422 if form.errors else 200)
