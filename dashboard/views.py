"""The ops dashboard: auth, typed parsing and one service call per decision.

Every decision is a plain form POST that redirects with a message (works without JavaScript);
htmx only enhances (partials, polling). Reads are scoped to the user's tenants (another tenant's
object is a 404) and every decision checks the user's role in the object's tenant (403).
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Model, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.utils.http import urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HTMX_STOP_POLLING, HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from dashboard import charts, live, selectors
from dashboard.forms import (
    ApproveForm,
    BulkForm,
    CompensateForm,
    QueueFilterForm,
    ReasonForm,
    ReconcileForm,
    ResumeForm,
)
from dashboard.permissions import Capability, TenantPermissions, can, require, tenant_ids_for, tenant_ids_with
from dashboard.templatetags.dashboard import pretty_json
from ledger.audit import Actor
from ledger.conf import saga
from ledger.errors import PlanChanged, SagaError
from ledger.models import Action, Risk, Run, Tenant
from ledger.selectors import checkpoints_for_run
from ledger.services import actions as ledger_actions
from recovery import approvals as recovery_approvals
from recovery import commands as recovery_commands
from recovery import decisions as recovery_decisions
from recovery import items as recovery_items
from recovery import planner
from recovery import selectors as recovery_selectors
from recovery import trail as recovery_trail
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from recovery.services import approving, bulk, cancelling, compensating, refusals, resolving

M = TypeVar("M", bound=Model)

ACTIONS_SHOWN = 50


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


# --- helpers ----------------------------------------------------------------------------------


def _actor(request: HttpRequest) -> Actor:
    # Every view that decides is behind login_required: the user is a real one.
    assert request.user.is_authenticated
    return Actor.for_user(request.user)


def _done(request: HtmxHttpRequest, url: str) -> HttpResponse:
    """After a decision: a 303 to ``url`` (or, for htmx, a client-side redirect there)."""
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url, status=303)


def _refused(request: HtmxHttpRequest, exc: SagaError, url: str) -> HttpResponse:
    """A domain error (conflict, invalid transition, self-approval …) is a message, never a 500,
    and a sentence, never the exception's text (``recovery.decisions.refusal_sentence``)."""
    messages.error(request, recovery_decisions.refusal_sentence(exc))
    return _done(request, url)


def _not_offered(request: HtmxHttpRequest, item: RecoveryItem, decision: str) -> HttpResponse | None:
    """A decision the run page does not offer now (``recovery.decisions``: the item is claimed by
    a compensation, already decided, the run cannot take it …) is refused with the page's own
    sentence, before any form or plan is shown or compared. A stale tab's POST is audited like any
    refused decision."""
    offered = recovery_decisions.decisions_for(
        run=item.run, item=item, unwind=selectors.run_latest_unwind(run=item.run)
    )
    verdict = getattr(offered, decision)
    if verdict:
        return None
    if request.method == "POST":
        refusals.refusal_record(
            decision=decision,
            exc=SagaError(verdict.why, details={"current": item.status}, code="decision_not_offered"),
            actor=_actor(request),
            reason=request.POST.get("reason", ""),
            item=item,
        )
    messages.error(request, verdict.why)
    return _done(request, _run_url(item.run_id))


def _form_errors(form: Any) -> str:
    # Every message names its field already ("A reason is required.", "Not valid JSON: …").
    return " ".join(str(error) for errors in form.errors.values() for error in errors)


def _run_url(run_id: str, anchor: str = "") -> str:
    return reverse("dashboard:run-detail", args=[run_id]) + (f"#{anchor}" if anchor else "")


def _visible(queryset: QuerySet[M], pk: str, request: HttpRequest, *, tenant_field: str = "tenant_id") -> M:
    """The object if it is in one of the user's tenants; otherwise 404, so it does not leak."""
    obj = queryset.filter(pk=pk, **{f"{tenant_field}__in": tenant_ids_for(request.user)}).first()
    if obj is None:
        raise Http404(f"No such {queryset.model._meta.verbose_name}.")
    return obj


def _get_item_for_user(request: HttpRequest, item_id: str, capability: Capability) -> RecoveryItem:
    item = _visible(
        RecoveryItem.objects.select_related("run__tenant", "tenant", "failed_action"), item_id, request
    )
    require(request.user, capability, item.tenant_id)
    return item


def _get_step_for_user(request: HttpRequest, step_id: str, capability: Capability) -> UnwindStep:
    step = _visible(
        UnwindStep.objects.select_related("unwind__run__tenant", "action"),
        step_id,
        request,
        tenant_field="unwind__tenant_id",
    )
    require(request.user, capability, step.unwind.tenant_id)
    return step


def _get_action_for_user(request: HttpRequest, action_id: str, capability: Capability) -> Action:
    action = _visible(Action.objects.select_related("run__tenant"), action_id, request)
    require(request.user, capability, action.tenant_id)
    return action


def _get_approval_for_user(request: HttpRequest, approval_id: str, capability: Capability) -> Approval:
    approval = _visible(
        Approval.objects.select_related("run__tenant", *selectors.APPROVAL_CARD_RELATED), approval_id, request
    )
    require(request.user, capability, approval.tenant_id)
    return approval


# --- Queue ------------------------------------------------------------------------------------


def _queue_filters(
    request: HttpRequest, tenants: list[Tenant]
) -> tuple[QueueFilterForm, selectors.QueueFilters]:
    form = QueueFilterForm(request.GET or None, tenants=tenants)
    if not request.GET:
        return form, selectors.QueueFilters()
    return form, form.filters()


@require_GET
@login_required
def queue(request: HtmxHttpRequest) -> HttpResponse:
    tenants = selectors.visible_tenants(user=request.user)
    form, filters = _queue_filters(request, tenants)
    page = selectors.queue_page(user=request.user, filters=filters, cursor=request.GET.get("cursor", ""))
    operable = set(tenant_ids_with(request.user, Capability.OPERATE))
    load_more = bool(request.htmx and request.htmx.target == "load-more")
    # The groups panel aggregates every matching item: not for "load more" (only rows are sent
    # back), nor while searching (a search looks for particular runs, and its substring match
    # would be paid a second time for a panel about the whole queue).
    show_groups = not load_more and not filters.q.strip()
    context = {
        "form": form,
        "filters": filters,
        "filter_query": urlencode(filters.as_query()),
        "page": page,
        "groups": selectors.queue_groups(user=request.user, filters=filters) if show_groups else [],
        "operable_tenant_ids": operable,
        "bulk_max": saga().bulk_max_items,
        "sla_minutes": saga().queue_sla_minutes,
        "since": page.read_at.isoformat() if page.read_at else "",
        "paged": bool(request.GET.get("cursor")),
        "polling": True,
    }
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
    tenants = selectors.visible_tenants(user=request.user)
    _form, filters = _queue_filters(request, tenants)
    try:
        since = parse_datetime(request.GET.get("since", ""))
    except ValueError:
        # Well-formed but impossible ("2026-13-45…"): treat like no reference time.
        since = None
    count = selectors.queue_new_count(user=request.user, filters=filters, since=since) if since else 0
    context = {
        "new_count": count,
        "capped": count > selectors.NEW_ITEMS_CAP,
        "cap": selectors.NEW_ITEMS_CAP,
        "since": since.isoformat() if since else "",
        "filter_query": urlencode(filters.as_query()),
        "polling": since is not None and count <= selectors.NEW_ITEMS_CAP,
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
        messages.error(request, _form_errors(form) if form.errors else "Select at least one item.")
        return _done(request, back)
    items = selectors.items_for_user(user=request.user, ids=ids)
    if len(items) != len(ids):
        raise Http404("Some selected items do not exist.")
    for item in items:
        require(request.user, Capability.OPERATE, item.tenant_id)
    operation = form.cleaned_data["operation"]
    service = bulk.items_bulk_close if operation == "close" else bulk.items_bulk_compensate
    try:
        outcomes = service(items=items, actor=_actor(request), reason=form.cleaned_data["reason"])
    except SagaError as exc:
        return _refused(request, exc, back)
    done = [o for o in outcomes if o.ok]
    if done:
        verb = "Closed" if operation == "close" else "Started compensation for"
        messages.success(request, f"{verb} {len(done)} item{'s' if len(done) != 1 else ''}.")
    for outcome in outcomes:
        if not outcome.ok:
            messages.error(request, f"{outcome.item_id}: {outcome.sentence or outcome.message}")
    return _done(request, back)


# --- Run page ---------------------------------------------------------------------------------


def _earlier(actions: list[Action]) -> list[Action]:
    """The actions before the newest ``ACTIONS_SHOWN``, which the run page shows on demand."""
    return actions[: max(len(actions) - ACTIONS_SHOWN, 0)]


@require_GET
@login_required
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = selectors.run_for_user(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    # A long run's ledger is shown from its newest actions (where a run fails); the earlier ones
    # come on demand (htmx, which needs nothing else of the page) or with ?actions=all. Rendering
    # hundreds of actions with their JSON and snapshot diffs was most of the page's time.
    if request.htmx and request.htmx.target == "earlier-actions":
        actions = selectors.run_actions(run=run)
        return render(
            request,
            "dashboard/run_detail.html#action-rows",
            {
                "run": run,
                "actions": _earlier(actions),
                "allowed": TenantPermissions(request.user, run.tenant_id),
                **_partial_marks(actions, recovery_trail.kept_action_ids(run=run)),
            },
        )
    page = selectors.run_page(run=run)
    earlier = _earlier(page.actions)
    if request.GET.get("actions") == "all":
        earlier = []
    return render(
        request,
        "dashboard/run_detail.html",
        {
            "p": page,
            "run": run,
            "actions": page.actions[len(earlier) :],
            "earlier_count": len(earlier),
            "earlier_unknown": sum(1 for a in earlier if a.status == Action.Status.UNKNOWN),
            "allowed": TenantPermissions(request.user, run.tenant_id),
            "item_open": page.item is not None and page.item.status in RecoveryItem.UNRESOLVED,
            "latest_checkpoint_id": page.checkpoints[0].pk if page.checkpoints else None,
            "reconcile_form": ReconcileForm(),
            "reason_form": ReasonForm(),
            "live": live.live_state(
                run=run,
                item=page.item,
                unwind=page.unwind,
                approvals=page.approvals,
                user=request.user,
                upto=page.actions[-1].seq if page.actions else 0,
            ),
            **_partial_marks(page.actions, {e["action_id"] for e in page.trail["kept"]}),
        },
    )


@require_GET
@login_required
def run_live(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The run page's poll (``dashboard.live``): 204 when nothing it shows changed; otherwise the
    new poller and an out-of-band swap of each changed region. 286 stops polling once the run
    is settled."""
    run = selectors.run_for_user(user=request.user, run_id=run_id)
    if run is None:
        raise Http404("No such run.")
    try:
        upto = max(0, int(request.GET.get("upto", "0")))
    except ValueError:
        upto = 0
    item = selectors.run_item(run=run)
    unwind = selectors.run_latest_unwind(run=run)
    approvals = selectors.run_pending_approvals(run=run)
    state = live.live_state(
        run=run, item=item, unwind=unwind, approvals=approvals, user=request.user, upto=upto
    )
    changed = live.changed_regions(state, {r: request.GET.get(r, "") for r in live.REGIONS})
    stop = not state.interval
    if not changed:
        return HttpResponse(status=HTMX_STOP_POLLING if stop else 204)
    page = selectors.RunPage(
        run=run,
        actions=[],
        warnings=[],
        checkpoints=[],
        events=[],
        item=item,
        unwind=unwind,
        approvals=approvals,
    )
    context: dict[str, Any] = {
        "p": page,
        "run": run,
        "live": state,
        "changed": changed,
        "allowed": TenantPermissions(request.user, run.tenant_id),
        "item_open": item is not None and item.status in RecoveryItem.UNRESOLVED,
        "item_replaced": (item.pk if item is not None else "") != request.GET.get("item_id", ""),
        "reason_form": ReasonForm(),
    }
    if "actions" in changed or "unwind" in changed:
        # The shown window of the ledger (its statuses and kept/undone marks), what arrived since
        # the page was loaded, and the correction trail, which follows the unwind.
        shown = list(
            Action.objects.filter(run=run, seq__gt=upto - ACTIONS_SHOWN, seq__lte=upto).order_by("seq")
        )
        context.update(
            actions=shown,
            newer_actions=Action.objects.filter(run=run, seq__gt=upto).count(),
            trail=recovery_trail.run_trail(run=run),
            **_partial_marks(shown, recovery_trail.kept_action_ids(run=run)),
        )
    if "audit" in changed:
        page.events, page.older_events = selectors.run_events(run=run)
    response = render(request, "dashboard/run_detail.html#live", context)
    if stop:
        response.status_code = HTMX_STOP_POLLING
    return response


def _partial_marks(actions: list[Action], kept_ids: set[str]) -> dict[str, set[str]]:
    """After a partial compensation, each action of its plan is marked "kept" or "undone"."""
    undone = {a.pk for a in actions if a.status == Action.Status.COMPENSATED} if kept_ids else set()
    return {"kept_ids": kept_ids, "undone_ids": undone}


def _render_preview(request: HtmxHttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    partial = f"{template}#preview" if request.htmx and not request.htmx.boosted else template
    return render(request, partial, context, status=422 if context["form"].errors else 200)


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
    checkpoints, _older = selectors.newest_checkpoints(run=item.run)
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
    try:
        unwind = compensating.unwind_start(
            item=item,
            actor=_actor(request),
            reason=data["reason"],
            action_ids=action_ids,
            to_checkpoint=to_checkpoint or None,
            plan_hash=shown_hash,
        )
    except PlanChanged:
        return _compensate_page(
            request,
            item,
            plan=planner.compensation_plan(run=run),
            form=form,
            notice=PLAN_CHANGED_NOTICE,
            status=409,
        )
    except SagaError as exc:
        return _refused(request, exc, _run_url(item.run_id))
    said = f"Compensation started: {unwind.steps.count()} step(s), newest action first."
    if plan.kept:
        said += (
            " Kept as they are: " + ", ".join(f"{s.action.tool} (#{s.action.seq})" for s in plan.kept) + "."
        )
    messages.success(request, said)
    return _done(request, _run_url(item.run_id, "unwind"))


@require_http_methods(["GET", "POST"])
@login_required
def run_flag(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Flag a run for review (any run, also a succeeded one): GET shows what will happen, POST
    puts it in the recovery queue, where it is compensated, resumed or closed like a failed run."""
    run = _visible(Run.objects.select_related("tenant"), run_id, request)
    require(request.user, Capability.OPERATE, run.tenant_id)
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            item = resolving.run_flag(run=run, actor=_actor(request), reason=form.cleaned_data["reason"])
        except SagaError as exc:
            return _refused(request, exc, _run_url(run.pk))
        messages.success(
            request,
            f"Flagged for review: the run is in the recovery queue ({item.get_reason_display().lower()}); "
            "nothing was undone. Decide below: compensate (all or some actions), resume or close.",
        )
        return _done(request, _run_url(run.pk))
    open_item = RecoveryItem.objects.filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
    return _render_preview(
        request,
        "dashboard/run_flag.html",
        {
            "run": run,
            "form": form,
            "open_item": open_item,
            "undoable": planner.compensation_plan(run=run).steps,
        },
    )


@require_http_methods(["GET", "POST"])
@login_required
def item_resume(request: HtmxHttpRequest, item_id: str) -> HttpResponse:
    item = _get_item_for_user(request, item_id, Capability.OPERATE)
    if (refused := _not_offered(request, item, "resume")) is not None:
        return refused
    checkpoints, _older = selectors.newest_checkpoints(run=item.run)
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
            resolving.item_resume(
                item=item, actor=_actor(request), reason=form.cleaned_data["reason"], checkpoint=checkpoint
            )
        except SagaError as exc:
            return _refused(request, exc, _run_url(item.run_id))
        messages.success(request, "Resume command issued; the agent picks it up on its next heartbeat.")
        return _done(request, _run_url(item.run_id))
    try:
        preview = recovery_selectors.resume_preview(item=item, checkpoint=checkpoint)
    except SagaError as exc:
        return _refused(request, exc, _run_url(item.run_id))
    return _render_preview(
        request,
        "dashboard/item_resume.html",
        {
            "item": item,
            "run": item.run,
            "preview": preview,
            "form": form,
            "checkpoint": checkpoint,
            # Whether anyone is there to pick the resume up (recovery.commands: the one rule).
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
            resolving.item_close(item=item, actor=_actor(request), reason=form.cleaned_data["reason"])
        except SagaError as exc:
            return _refused(request, exc, _run_url(item.run_id))
        messages.success(request, "Closed. Nothing was undone; the reason is in the audit log.")
        return _done(request, _run_url(item.run_id))
    return _render_preview(
        request, "dashboard/item_close.html", {"item": item, "run": item.run, "form": form}
    )


@require_http_methods(["GET", "POST"])
@login_required
def run_cancel(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Cancel a run: GET shows exactly what will happen (the confirmation), POST does it."""
    run = _visible(Run.objects.select_related("tenant"), run_id, request)
    require(request.user, Capability.OPERATE, run.tenant_id)
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            outcome = cancelling.run_cancel(
                run=run, actor=_actor(request), reason=form.cleaned_data["reason"]
            )
        except SagaError as exc:
            return _refused(request, exc, _run_url(run.pk))
        said = ["Run cancelled: its agent can write no more and is told to stop."]
        if outcome.unknown:
            count = len(outcome.unknown)
            said.append(
                f"{count} action{pluralize(count)} it had running now ha{pluralize(count, 's,ve')} an "
                "unknown outcome: confirm whether each happened."
            )
        if outcome.item is not None:
            said.append("The run is in the recovery queue for a decision about what it changed.")
        messages.success(request, " ".join(said))
        return _done(request, _run_url(run.pk))
    return _render_preview(
        request,
        "dashboard/run_cancel.html",
        {"run": run, "preview": recovery_selectors.cancel_preview(run=run), "form": form},
    )


@require_POST
@login_required
def item_assign(request: HtmxHttpRequest, item_id: str) -> HttpResponse:
    item = _get_item_for_user(request, item_id, Capability.OPERATE)
    unassign = request.POST.get("assignee") == "none"
    try:
        actor = _actor(request)
        # actor.user is request.user, known to be signed in once _actor has checked it.
        recovery_items.item_assign(item=item, actor=actor, assignee=None if unassign else actor.user)
    except SagaError as exc:
        return _refused(request, exc, _run_url(item.run_id))
    messages.success(request, "Unassigned." if unassign else "Assigned to you.")
    return _done(request, _run_url(item.run_id))


@require_GET
@login_required
def unwind_progress(request: HtmxHttpRequest, unwind_id: str) -> HttpResponse:
    unwind = selectors.unwind_with_steps(unwind_id=unwind_id, tenant_ids=tenant_ids_for(request.user))
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
    unwind = selectors.unwind_with_steps(unwind_id=unwind_id, tenant_ids=tenant_ids_for(request.user))
    if unwind is None:
        raise Http404("No such unwind.")
    require(request.user, Capability.OPERATE, unwind.tenant_id)
    back = _run_url(unwind.run_id, "unwind")
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            stopped = compensating.unwind_stop(
                unwind=unwind, actor=_actor(request), reason=form.cleaned_data["reason"]
            )
        except SagaError as exc:
            return _refused(request, exc, back)
        running = stopped.steps.filter(status=UnwindStep.Status.RUNNING).exists()
        messages.success(
            request,
            "Compensation stopped: no further step starts"
            + (" (the step in flight finishes and its outcome is recorded)" if running else "")
            + ". The run is back in the recovery queue with what was undone and what was not.",
        )
        return _done(request, back)
    return _render_preview(
        request, "dashboard/unwind_stop.html", {"unwind": unwind, "run": unwind.run, "form": form}
    )


@require_POST
@login_required
def step_ask_again(request: HtmxHttpRequest, step_id: str) -> HttpResponse:
    """A step whose approval expired or was rejected: ask the approvers again (same tool, same
    args); the compensation waits on the step until they decide."""
    step = _get_step_for_user(request, step_id, Capability.OPERATE)
    back = _run_url(step.unwind.run_id, "unwind")
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, _form_errors(form))
        return _done(request, back)
    approval = Approval.objects.filter(step=step).first()
    if approval is None:
        messages.error(request, "This step has no approval to ask again for.")
        return _done(request, back)
    try:
        approving.approval_request_again(
            approval=approval, actor=_actor(request), reason=form.cleaned_data["reason"]
        )
    except SagaError as exc:
        return _refused(request, exc, back)
    messages.success(
        request,
        f"Approval asked again for step #{step.position + 1} ({step.tool}): it waits in the approval "
        "inbox, and the compensation goes on once it is decided.",
    )
    return _done(request, back)


def _step_decision(request: HtmxHttpRequest, step_id: str, *, skip: bool) -> HttpResponse:
    step = _get_step_for_user(request, step_id, Capability.OPERATE)
    back = _run_url(step.unwind.run_id, "unwind")
    form = ReasonForm(request.POST)
    if not form.is_valid():
        messages.error(request, _form_errors(form))
        return _done(request, back)
    service = compensating.step_skip if skip else compensating.step_retry
    try:
        service(step=step, actor=_actor(request), reason=form.cleaned_data["reason"])
    except SagaError as exc:
        return _refused(request, exc, back)
    messages.success(
        request,
        f"Step #{step.position + 1} ({step.tool or 'no tool'}) "
        f"{'skipped: its forward effect stands' if skip else 'queued again'}.",
    )
    return _done(request, back)


@require_POST
@login_required
def step_retry(request: HtmxHttpRequest, step_id: str) -> HttpResponse:
    return _step_decision(request, step_id, skip=False)


@require_POST
@login_required
def step_skip(request: HtmxHttpRequest, step_id: str) -> HttpResponse:
    return _step_decision(request, step_id, skip=True)


@require_POST
@login_required
def action_reconcile(request: HtmxHttpRequest, action_id: str) -> HttpResponse:
    action = _get_action_for_user(request, action_id, Capability.OPERATE)
    # Back to the action's card: on the page as served when it is among the newest actions, with
    # every action shown when it is older (so the anchor exists however long the run is).
    shown = action.seq > action.run.action_count - ACTIONS_SHOWN
    back = reverse("dashboard:run-detail", args=[action.run_id]) + (
        f"#action-{action.seq}" if shown else f"?actions=all#action-{action.seq}"
    )
    form = ReconcileForm(request.POST)
    if not form.is_valid():
        messages.error(request, _form_errors(form))
        return _done(request, back)
    try:
        ledger_actions.action_reconcile(
            action=action,
            actor=_actor(request),
            happened=form.cleaned_data["happened"],
            reason=form.cleaned_data["reason"],
        )
    except SagaError as exc:
        return _refused(request, exc, back)
    outcome = "happened" if form.cleaned_data["happened"] else "did not happen"
    messages.success(request, f"Recorded that {action.tool} (#{action.seq}) {outcome}.")
    return _done(request, back)


# --- Approval inbox ---------------------------------------------------------------------------


def _keys_owned(request: HttpRequest) -> recovery_approvals.OwnedKeys:
    """The keys the signed-in person owns (they asked through them too), read once per request
    however many cards ask."""
    owned: recovery_approvals.OwnedKeys | None = getattr(request, "_saga_keys_owned", None)
    if owned is None:
        owned = recovery_approvals.keys_owned(recovery_approvals.person_of(_actor(request)))
        request._saga_keys_owned = owned  # type: ignore[attr-defined]
    return owned


def _approval_card(request: HtmxHttpRequest, approval: Approval, **extra: Any) -> dict[str, Any]:
    return {
        "approval": approval,
        # What the card says will happen: computed in one place, the template only renders it.
        "content": selectors.approval_card_content(approval),
        "approve_form": extra.pop("approve_form", None)
        or ApproveForm(
            initial={
                "args": pretty_json(approval.args) if approval.args is not None else "",
                "shown_args_hash": approval.args_hash,
            },
            prefix=approval.pk,
        ),
        "reject_form": extra.pop("reject_form", None) or ReasonForm(prefix=f"{approval.pk}-reject"),
        "can_decide": can(request.user, Capability.APPROVE, approval.tenant_id),
        # Whoever asked may reject but never grant (the service refuses: self_approval).
        "own_request": recovery_approvals.is_requester(approval, _actor(request), owned=_keys_owned(request)),
        **extra,
    }


@require_GET
@login_required
def approvals(request: HtmxHttpRequest) -> HttpResponse:
    cursor = request.GET.get("cursor", "")
    page = selectors.approvals_pending(user=request.user, cursor=cursor)
    context = {
        "cards": [_approval_card(request, approval) for approval in page.approvals],
        "next_cursor": page.next_cursor,
        "paged": bool(cursor),
    }
    if request.htmx and request.htmx.target == "approvals-more":
        return render(request, "dashboard/approvals.html#approval-cards", context)
    return render(request, "dashboard/approvals.html", context)


def _approval_decision(request: HtmxHttpRequest, approval_id: str, *, approve: bool) -> HttpResponse:
    approval = _get_approval_for_user(request, approval_id, Capability.APPROVE)
    back = reverse("dashboard:approvals")
    if approve:
        form: ReasonForm = ApproveForm(request.POST, prefix=approval.pk)
    else:
        form = ReasonForm(request.POST, prefix=f"{approval.pk}-reject")
    error = ""
    granted = ""
    if form.is_valid():
        try:
            if approve:
                decided = approving.approval_approve(
                    approval=approval,
                    actor=_actor(request),
                    reason=form.cleaned_data["reason"],
                    args=form.cleaned_data["args"],
                    shown_args_hash=form.cleaned_data["shown_args_hash"],
                )
                if decided.status == Approval.Status.PENDING:
                    granted = (
                        f"Your grant is recorded ({selectors.grants_line(decided)}); "
                        "another approver must grant it too."
                    )
            else:
                approving.approval_reject(
                    approval=approval, actor=_actor(request), reason=form.cleaned_data["reason"]
                )
        except SagaError as exc:
            error = recovery_decisions.refusal_sentence(exc)
    else:
        error = _form_errors(form)
    if not request.htmx:
        if error:
            messages.error(request, f"{approval.tool}: {error}")
        elif granted:
            messages.success(request, f"{approval.tool}: {granted}")
        else:
            messages.success(
                request,
                f"{'Approved' if approve else 'Rejected'} {approval.tool} on "
                f"{approval.action.target_id or approval.run_id}.",
            )
        return HttpResponseRedirect(back, status=303)
    approval.refresh_from_db()
    forms = {"approve_form": form} if approve else {"reject_form": form}
    context = _approval_card(request, approval, error=error, granted=granted, **forms)
    response = render(
        request, "dashboard/approvals.html#approval-card", context, status=409 if error else 200
    )
    # The nav's Approvals badge counts what is still pending: it drops with the decision.
    response.content += render_to_string(
        "dashboard/_nav_approvals_badge.html",
        {"badge": live.nav_badge(user=request.user), "oob": True},
        request=request,
    ).encode()
    return response


@require_POST
@login_required
def approval_approve(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    return _approval_decision(request, approval_id, approve=True)


@require_POST
@login_required
def approval_reject(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    return _approval_decision(request, approval_id, approve=False)


# --- Metrics and policies ---------------------------------------------------------------------


@require_GET
@login_required
def metrics(request: HtmxHttpRequest) -> HttpResponse:
    window = request.GET.get("window", "7d")
    tenants = selectors.visible_tenants(user=request.user)
    tenant = request.GET.get("tenant", "")
    data = selectors.metrics(user=request.user, window=window, tenant=tenant)
    return render(
        request,
        "dashboard/metrics.html",
        {
            "m": data,
            "tenants": tenants,
            "tenant": tenant,
            "windows": list(selectors.METRIC_WINDOWS),
            "risk_chart": charts.bar_chart(
                data.open_by_risk, css_prefix="risk-", keys=[r.value for r in Risk]
            ),
            "reason_chart": charts.bar_chart(data.open_by_reason),
            "tools_chart": charts.bar_chart(data.top_failing_tools),
            "latency_chart": charts.bar_chart(
                [
                    ("Unwind p50", data.unwind_p50_s),
                    ("Unwind p95", data.unwind_p95_s),
                    ("Approval wait p50", data.approval_p50_s),
                    ("Approval wait p95", data.approval_p95_s),
                ],
                unit="s",
            ),
        },
    )


@require_GET
@login_required
def policies(request: HtmxHttpRequest) -> HttpResponse:
    tenants = selectors.visible_tenants(user=request.user)
    return render(
        request,
        "dashboard/policies.html",
        {
            # Where a compensator points (its URL or Python path) is for those who operate the
            # tenant: operators and admins, not viewers or approvers.
            "sections": [
                selectors.policies_for(
                    tenant=tenant,
                    show_targets=can(request.user, Capability.OPERATE, tenant.pk),
                )
                for tenant in tenants
            ],
        },
    )
