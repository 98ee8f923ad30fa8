"""A compensation in progress: its progress poll, stopping it between steps, and the decisions on
one step (ask its approvers again, retry, skip)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HTMX_STOP_POLLING

from dashboard.forms import ReasonForm
from dashboard.permissions import Capability, TenantPermissions, reach_for, require
from dashboard.selectors import runs as run_selectors
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from recovery.actions import approvals, compensations
from recovery.models import Approval, Unwind, UnwindStep


def _get_step_for_user(request: HttpRequest, step_id: str, capability: Capability) -> UnwindStep:
    step = common.get_or_404(
        UnwindStep.objects.select_related("unwind__run__tenant", "action"),
        step_id,
        request,
        tenant_field="unwind__tenant_id",
    )
    require(request.user, capability, step.unwind.tenant_id)
    return step


def _step_and_reason(request: HttpRequest, step_id: str) -> tuple[UnwindStep, str, str | None]:
    """The step an operator decides about, where its page is (the run's unwind section), and the
    reason they gave: None when the form was invalid, its error already in the page's messages."""
    step = _get_step_for_user(request, step_id, Capability.OPERATE)
    back = common.run_url(step.unwind.run_id, "unwind")
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, common.form_errors(form))
        return step, back, None
    return step, back, form.cleaned_data["reason"]


@require_GET
@login_required
def unwind_progress(request: HtmxHttpRequest, unwind_id: str) -> HttpResponse:
    unwind = run_selectors.unwind_with_steps(reach=reach_for(request.user), unwind_id=unwind_id)
    if unwind is None:
        raise Http404("No such unwind.")
    context = {
        "unwind": unwind,
        "allowed": TenantPermissions(request.user, unwind.tenant_id),
        "reason_form": ReasonForm(),
    }
    response = render(request, "dashboard/run_detail.html#unwind-progress", context)
    if unwind.status not in (Unwind.Status.RUNNING, Unwind.Status.PAUSED):
        response.status_code = HTMX_STOP_POLLING
    return response


@require_http_methods(["GET", "POST"])
@login_required
def unwind_stop(request: HtmxHttpRequest, unwind_id: str) -> HttpResponse:
    """Stop a running compensation between steps: GET shows exactly what will happen to each step
    (the confirmation), POST does it."""
    unwind = run_selectors.unwind_with_steps(reach=reach_for(request.user), unwind_id=unwind_id)
    if unwind is None:
        raise Http404("No such unwind.")
    require(request.user, Capability.OPERATE, unwind.tenant_id)
    back = common.run_url(unwind.run_id, "unwind")
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            stopped = compensations.unwind_stop(
                unwind=unwind, actor=common.actor(request), reason=form.cleaned_data["reason"]
            )
        except SagaError as exc:
            return common.refused(request, exc, back)
        running = stopped.steps.filter(status=UnwindStep.Status.RUNNING).exists()
        messages.success(
            request,
            "Compensation stopped: no further step starts"
            + (" (the step in flight finishes and its outcome is recorded)" if running else "")
            + ". The run is back in the recovery queue with what was undone and what was not.",
        )
        return common.done(request, back)
    return common.render_preview(
        request, "dashboard/unwind_stop.html", {"unwind": unwind, "run": unwind.run, "form": form}
    )


@require_POST
@login_required
def step_ask_again(request: HtmxHttpRequest, step_id: str) -> HttpResponse:
    """A step whose approval expired or was rejected: ask the approvers again (same tool, same
    args); the compensation waits on the step until they decide."""
    step, back, reason = _step_and_reason(request, step_id)
    if reason is None:
        return common.done(request, back)
    approval = Approval.objects.filter(step=step).first()
    if approval is None:
        messages.error(request, "This step has no approval to ask again for.")
        return common.done(request, back)
    try:
        approvals.approval_request_again(approval=approval, actor=common.actor(request), reason=reason)
    except SagaError as exc:
        return common.refused(request, exc, back)
    messages.success(
        request,
        f"Approval asked again for step #{step.position + 1} ({step.tool}): it waits in the approval "
        "inbox, and the compensation goes on once it is decided.",
    )
    return common.done(request, back)


def _step_decision(request: HtmxHttpRequest, step_id: str, *, skip: bool) -> HttpResponse:
    step, back, reason = _step_and_reason(request, step_id)
    if reason is None:
        return common.done(request, back)
    service = compensations.step_skip if skip else compensations.step_retry
    try:
        service(step=step, actor=common.actor(request), reason=reason)
    except SagaError as exc:
        return common.refused(request, exc, back)
    messages.success(
        request,
        f"Step #{step.position + 1} ({step.tool or 'no tool'}) "
        f"{'skipped: its forward effect stands' if skip else 'queued again'}.",
    )
    return common.done(request, back)


@require_POST
@login_required
def step_retry(request: HtmxHttpRequest, step_id: str) -> HttpResponse:
    return _step_decision(request, step_id, skip=False)


@require_POST
@login_required
def step_skip(request: HtmxHttpRequest, step_id: str) -> HttpResponse:
    return _step_decision(request, step_id, skip=True)
