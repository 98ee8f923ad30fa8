"""Decisions on a recovery item: compensate (all, some actions, or back to a checkpoint, with the
plan shown and confirmed), resume (from a checkpoint), close, assign. A decision the run page does
not offer now is refused with the page's own sentence."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.forms import CompensateForm, ReasonForm, ResumeForm
from dashboard.permissions import Capability, require
from dashboard.selectors import runs as run_selectors
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.conf import saga
from infra.errors import PlanChanged, SagaError
from ledger.selectors import checkpoints_for_run
from recovery import compensator_checks, planner
from recovery import decisions as recovery_decisions
from recovery import selectors as recovery_selectors
from recovery.actions import commands as recovery_commands
from recovery.actions import compensations, refusals, resolutions
from recovery.models import RecoveryItem
from recovery.transitions import items as recovery_items


def _get_item_for_user(request: HttpRequest, item_id: str, capability: Capability) -> RecoveryItem:
    item = common.get_or_404(
        RecoveryItem.objects.select_related("run__tenant", "tenant", "failed_action"), item_id, request
    )
    require(request.user, capability, item.tenant_id)
    return item


def _not_offered(request: HtmxHttpRequest, item: RecoveryItem, decision: str) -> HttpResponse | None:
    """A decision the run page does not offer now (``recovery.decisions``: the item is claimed by
    a compensation, already decided, the run cannot take it …) is refused with the page's own
    sentence, before any form or plan is shown or compared. A stale tab's POST is audited like any
    refused decision."""
    offered = recovery_decisions.decisions_for(
        run=item.run, item=item, unwind=run_selectors.run_latest_unwind(run=item.run)
    )
    verdict = getattr(offered, decision)
    if verdict:
        return None
    if request.method == "POST":
        refusals.refusal_record(
            decision=decision,
            exc=SagaError(verdict.why, details={"current": item.status}, code="decision_not_offered"),
            actor=common.actor(request),
            reason=request.POST.get("reason", ""),
            item=item,
        )
    messages.error(request, verdict.why)
    return common.done(request, common.run_url(item.run_id))


PLAN_CHANGED_NOTICE = (
    "The plan changed since you opened it (an action finished, or its arguments or policy changed). "
    "Nothing was started: this is the plan now; review it and confirm again."
)


def _compensate_page(
    request: HtmxHttpRequest,
    item: RecoveryItem,
    *,
    plan: planner.Plan,
    form: CompensateForm,
    stage: str = "choose",
    chosen: set[str] | None = None,
    scope: str = "actions",
    to_checkpoint: str = "",
    notice: str = "",
    selection_error: str = "",
    status: int = 200,
) -> HttpResponse:
    checkpoints, _older = run_selectors.newest_checkpoints(run=item.run)
    context = {
        "item": item,
        "run": item.run,
        "plan": plan,
        "form": form,
        "stage": stage,
        # Every undoable step is ticked until the operator unticks it.
        "chosen": chosen if chosen is not None else {s.action.pk for s in plan.steps if s.can_undo},
        "scope": scope,
        "to_checkpoint": to_checkpoint,
        "checkpoints": checkpoints,
        "notice": notice,
        "selection_error": selection_error,
        # Compensators never checked, failing or not checked for long (recovery.compensator_checks).
        "check_flags": compensator_checks.check_flags(
            tenant=item.run.tenant, tools=[s.tool for s in plan.steps if s.can_undo]
        ),
    }
    template = "dashboard/item_compensate.html"
    partial = f"{template}#preview" if request.htmx and not request.htmx.boosted else template
    return render(request, partial, context, status=status)


@require_http_methods(["GET", "POST"])
@login_required
def item_compensate(request: HtmxHttpRequest, item_id: str) -> HttpResponse:
    """Compensate all or part of the plan. The page shows the plan with a ticked box per step and
    a "to checkpoint" choice; everything ticked runs on confirming, as shown. A partial choice is
    shown back first (exactly the steps that run and those kept) and runs only when confirmed
    there. The plan_hash the page carried must still be the plan's: otherwise the new plan is
    shown instead of running anything. Which choices are valid is the planner's rule."""
    item = _get_item_for_user(request, item_id, Capability.OPERATE)
    if (refused := _not_offered(request, item, "compensate")) is not None:
        return refused
    run = item.run
    if request.method != "POST":
        return _compensate_page(request, item, plan=planner.compensation_plan(run=run), form=CompensateForm())
    form = CompensateForm(request.POST)
    chosen = request.POST.getlist("action_ids")
    valid = form.is_valid()
    data = form.cleaned_data
    scope = data.get("scope") or ""
    to_checkpoint = (data.get("to_checkpoint") or "") if scope == "checkpoint" else ""
    full = planner.compensation_plan(run=run)
    if not valid:
        return _compensate_page(
            request, item, plan=full, form=form, chosen=set(chosen), scope=scope or "actions", status=422
        )
    # No scope (a plain POST with a reason, as before partial compensation): the whole plan.
    action_ids: list[str] | None = None
    if scope == "actions" and set(chosen) != {s.action.pk for s in full.steps if s.can_undo}:
        action_ids = chosen
    shown_hash = data.get("plan_hash") or None
    partial = action_ids is not None or scope == "checkpoint"
    try:
        plan = planner.compensation_plan(
            run=run, action_ids=action_ids, to_checkpoint=to_checkpoint if scope == "checkpoint" else None
        )
    except SagaError as exc:
        return _compensate_page(
            request,
            item,
            plan=full,
            form=form,
            chosen=set(chosen),
            scope=scope,
            to_checkpoint=to_checkpoint,
            selection_error=exc.message,
            status=422,
        )
    if shown_hash is not None and shown_hash != plan.plan_hash:
        return _compensate_page(request, item, plan=full, form=form, notice=PLAN_CHANGED_NOTICE, status=409)
    if partial and data.get("stage") != "confirm" and item.status == RecoveryItem.Status.OPEN:
        return _compensate_page(
            request, item, plan=plan, form=form, stage="review", scope=scope, to_checkpoint=to_checkpoint
        )
    return _compensation_start(
        request,
        item,
        form=form,
        plan=plan,
        reason=data["reason"],
        action_ids=action_ids,
        to_checkpoint=to_checkpoint,
        shown_hash=shown_hash,
    )


def _compensation_start(
    request: HtmxHttpRequest,
    item: RecoveryItem,
    *,
    form: CompensateForm,
    plan: planner.Plan,
    reason: str,
    action_ids: list[str] | None,
    to_checkpoint: str,
    shown_hash: str | None,
) -> HttpResponse:
    """Start the compensation as confirmed (``plan``: what the operator saw), saying what runs and
    what is kept; a plan that changed meanwhile is shown again instead of starting anything."""
    try:
        unwind = compensations.unwind_start(
            item=item,
            actor=common.actor(request),
            reason=reason,
            action_ids=action_ids,
            to_checkpoint=to_checkpoint or None,
            plan_hash=shown_hash,
        )
    except PlanChanged:
        return _compensate_page(
            request,
            item,
            plan=planner.compensation_plan(run=item.run),
            form=form,
            notice=PLAN_CHANGED_NOTICE,
            status=409,
        )
    except SagaError as exc:
        return common.refused(request, exc, common.run_url(item.run_id))
    said = f"Compensation started: {unwind.steps.count()} step(s), newest action first."
    if plan.kept:
        said += (
            " Kept as they are: " + ", ".join(f"{s.action.tool} (#{s.action.seq})" for s in plan.kept) + "."
        )
    messages.success(request, said)
    return common.done(request, common.run_url(item.run_id, "unwind"))


@require_http_methods(["GET", "POST"])
@login_required
def item_resume(request: HtmxHttpRequest, item_id: str) -> HttpResponse:
    item = _get_item_for_user(request, item_id, Capability.OPERATE)
    if (refused := _not_offered(request, item, "resume")) is not None:
        return refused
    checkpoints, _older = run_selectors.newest_checkpoints(run=item.run)
    chosen_id = (request.POST or request.GET).get("checkpoint") or ""
    checkpoint = next((c for c in checkpoints if c.pk == chosen_id), None)
    if checkpoint is None and chosen_id:
        # An older checkpoint than the form lists, named in the link or form: still this run's.
        checkpoint = checkpoints_for_run(run=item.run).filter(pk=chosen_id[:40]).first()
        if checkpoint is not None:
            checkpoints.append(checkpoint)
    form = ResumeForm(request.POST or None, checkpoints=checkpoints)
    if request.method == "POST" and form.is_valid():
        try:
            resolutions.item_resume(
                item=item,
                actor=common.actor(request),
                reason=form.cleaned_data["reason"],
                checkpoint=checkpoint,
            )
        except SagaError as exc:
            return common.refused(request, exc, common.run_url(item.run_id))
        messages.success(request, "Resume command issued; the agent picks it up on its next heartbeat.")
        return common.done(request, common.run_url(item.run_id))
    try:
        preview = recovery_selectors.resume_preview(item=item, checkpoint=checkpoint)
    except SagaError as exc:
        return common.refused(request, exc, common.run_url(item.run_id))
    return common.render_preview(
        request,
        "dashboard/item_resume.html",
        {
            "item": item,
            "run": item.run,
            "preview": preview,
            "form": form,
            "checkpoint": checkpoint,
            # Whether anyone is there to pick the resume up (recovery.actions.commands: the one rule).
            "pulse": recovery_commands.agent_pulse(run=item.run),
            "ack_timeout_s": saga().resume_ack_timeout_s,
        },
    )


@require_http_methods(["GET", "POST"])
@login_required
def item_close(request: HtmxHttpRequest, item_id: str) -> HttpResponse:
    item = _get_item_for_user(request, item_id, Capability.OPERATE)
    if (refused := _not_offered(request, item, "close")) is not None:
        return refused
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            resolutions.item_close(item=item, actor=common.actor(request), reason=form.cleaned_data["reason"])
        except SagaError as exc:
            return common.refused(request, exc, common.run_url(item.run_id))
        messages.success(request, "Closed. Nothing was undone; the reason is in the audit log.")
        return common.done(request, common.run_url(item.run_id))
    return common.render_preview(
        request, "dashboard/item_close.html", {"item": item, "run": item.run, "form": form}
    )


@require_POST
@login_required
def item_assign(request: HtmxHttpRequest, item_id: str) -> HttpResponse:
    item = _get_item_for_user(request, item_id, Capability.OPERATE)
    unassign = request.POST.get("assignee") == "none"
    try:
        actor = common.actor(request)
        # actor.user is request.user, known to be signed in once _actor has checked it.
        recovery_items.item_assign(item=item, actor=actor, assignee=None if unassign else actor.user)
    except SagaError as exc:
        return common.refused(request, exc, common.run_url(item.run_id))
    messages.success(request, "Unassigned." if unassign else "Assigned to you.")
    return common.done(request, common.run_url(item.run_id))
