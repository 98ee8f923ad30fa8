"""Reconciling an action whose outcome is unknown: a person records whether it happened."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.forms import ReconcileForm
from dashboard.permissions import Capability, require
from dashboard.selectors import runs as run_selectors
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from ledger.models import Action
from ledger.services.actions import moves


def _get_action_for_user(request: HttpRequest, action_id: str, capability: Capability) -> Action:
    action = common.get_or_404(Action.objects.select_related("run__tenant"), action_id, request)
    require(request.user, capability, action.tenant_id)
    return action


@require_POST
@login_required
def action_reconcile(request: HtmxHttpRequest, action_id: str) -> HttpResponse:
    action = _get_action_for_user(request, action_id, Capability.OPERATE)
    # Back to the action's card: on the page as served when it is among the newest actions, else
    # on the page of older actions that holds it (so the anchor exists however long the run is).
    shown = action.seq > action.run.action_count - run_selectors.RUN_PAGE_ACTIONS
    older = "" if shown else f"?cursor={run_selectors.actions_cursor_through(seq=action.seq)}"
    back = reverse("dashboard:run-detail", args=[action.run_id]) + f"{older}#action-{action.seq}"
    form = ReconcileForm(request.POST)
    if not form.is_valid():
        messages.error(request, common.form_errors(form))
        return common.done(request, back)
    try:
        moves.action_reconcile(
            action=action,
            actor=common.actor(request),
            happened=form.cleaned_data["happened"],
            reason=form.cleaned_data["reason"],
        )
    except SagaError as exc:
        return common.refused(request, exc, back)
    outcome = "happened" if form.cleaned_data["happened"] else "did not happen"
    messages.success(request, f"Recorded that {action.tool} (#{action.seq}) {outcome}.")
    return common.done(request, back)
