"""The run page and its live poll (``dashboard.selectors.live``: only the regions that changed),
and the decisions about a whole run: flag it for review, cancel it."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.template.defaultfilters import pluralize
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import HTMX_STOP_POLLING

from dashboard.forms import ReasonForm, ReconcileForm
from dashboard.permissions import Capability, TenantPermissions, reach_for, require
from dashboard.presenters.images import images_by_action
from dashboard.selectors import live
from dashboard.selectors import runs as run_selectors
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError, ValidationFailed
from ledger.models import Action, Run
from recovery import planner
from recovery import selectors as recovery_selectors
from recovery import trail as recovery_trail
from recovery.actions import cancellations, resolutions
from recovery.models import RecoveryItem

# How many of a run's warnings its page lists (the rest are counted).
WARNINGS_SHOWN = 20


@require_GET
@login_required
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_selectors.page_run(reach=reach_for(request.user), run_id=run_id)
    if run is None:
        return common.run_missing(request, run_id)
    # The ledger is shown a page at a time, newest first (where a run fails): the page is served
    # with its newest actions, "Load more" brings the page before them (htmx: only its rows and
    # the next Load more; without JavaScript, the page with those actions). Never the whole ledger
    # at once: a run of thousands of actions is as fast to open as one of fifty.
    cursor = request.GET.get("cursor") or None
    if request.htmx and request.htmx.target == "load-more":
        try:
            older = run_selectors.run_actions_page(run=run, cursor=cursor)
        except ValidationFailed:
            return HttpResponseBadRequest("This link's cursor is not one the page handed out.")
        actions = older.items[::-1]
        return render(
            request,
            "dashboard/run_detail.html#action-page",
            {
                "run": run,
                "actions": actions,
                "older": {"next_cursor": older.next_cursor},
                "allowed": TenantPermissions(request.user, run.tenant_id),
                "images": _images(actions),
                **_partial_marks(actions, recovery_trail.kept_action_ids(run=run)),
            },
        )
    try:
        page = run_selectors.run_page(run=run, cursor=cursor)
    except ValidationFailed:
        return HttpResponseBadRequest("This link's cursor is not one the page handed out.")
    shown = {a.pk for a in page.actions}
    return render(
        request,
        "dashboard/run_detail.html",
        {
            "p": page,
            "run": run,
            "actions": page.actions,
            "older": {"next_cursor": page.older_actions},
            "paged": cursor is not None,
            # Unknown outcomes among the actions not shown (the warnings name every one).
            "older_note": _unknown_note(
                sum(
                    1 for w in page.warnings if w["code"] == "outcome_unknown" and w["action_id"] not in shown
                )
            ),
            # A long run can carry thousands of warnings (every step after a pivot): the first ones.
            "warnings_shown": WARNINGS_SHOWN,
            "warnings_not_shown": max(len(page.warnings) - WARNINGS_SHOWN, 0),
            "allowed": TenantPermissions(request.user, run.tenant_id),
            "item_open": page.item is not None and page.item.status in RecoveryItem.UNRESOLVED,
            "latest_checkpoint_id": page.checkpoints[0].pk if page.checkpoints else None,
            "reconcile_form": ReconcileForm(),
            "images": _images(page.actions),
            "reason_form": ReasonForm(),
            "live": live.live_state(
                run=run,
                item=page.item,
                unwind=page.unwind,
                approvals=page.approvals,
                user=request.user,
                upto=page.actions[-1].seq if page.actions else 0,
            ),
            **_partial_marks(page.actions, recovery_trail.kept_action_ids(run=run)),
        },
    )


@require_GET
@login_required
def run_trail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The run's correction trail: what the run page loads into its trail slot once it is shown
    (htmx), so the page's own request never builds a trail that lists every change of a long run;
    without JavaScript, a page of its own."""
    run = run_selectors.page_run(reach=reach_for(request.user), run_id=run_id)
    if run is None:
        return common.run_missing(request, run_id)
    trail = recovery_trail.run_trail(run=run)
    if request.htmx:
        return render(request, "dashboard/_trail.html", {"trail": trail})
    return render(request, "dashboard/run_trail.html", {"run": run, "trail": trail})


@require_GET
@login_required
def run_live(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The run page's poll (``dashboard.selectors.live``): 204 when nothing it shows changed; otherwise the
    new poller and an out-of-band swap of each changed region. 286 stops polling once the run
    is settled."""
    run = run_selectors.page_run(reach=reach_for(request.user), run_id=run_id)
    if run is None:
        return common.run_missing(request, run_id)
    try:
        upto = max(0, int(request.GET.get("upto", "0")))
    except ValueError:
        upto = 0
    item = run_selectors.run_item(run=run)
    unwind = run_selectors.run_latest_unwind(run=run)
    approvals = run_selectors.run_pending_approvals(run=run)
    state = live.live_state(
        run=run, item=item, unwind=unwind, approvals=approvals, user=request.user, upto=upto
    )
    changed = live.changed_regions(state, {r: request.GET.get(r, "") for r in live.REGIONS})
    stop = not state.interval
    if not changed:
        return HttpResponse(status=HTMX_STOP_POLLING if stop else 204)
    page = run_selectors.RunPage(
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
            Action.objects.filter(
                run=run, seq__gt=upto - run_selectors.RUN_PAGE_ACTIONS, seq__lte=upto
            ).order_by("seq")
        )
        context.update(
            actions=shown,
            newer_actions=Action.objects.filter(run=run, seq__gt=upto).count(),
            trail=recovery_trail.run_trail(run=run),
            # The images follow the unwind: what it read back, whether it verified.
            images=_images(shown),
            **_partial_marks(shown, recovery_trail.kept_action_ids(run=run)),
        )
    if "header" in changed and "trail" not in context:
        # The trail tells the run's state too ("… and the run is running"): it follows the header.
        context["trail"] = recovery_trail.run_trail(run=run)
    if "audit" in changed:
        page.events, page.older_events = run_selectors.run_events(run=run)
    response = render(request, "dashboard/run_detail.html#live", context)
    if stop:
        response.status_code = HTMX_STOP_POLLING
    return response


def _images(actions: list[Action]) -> dict[str, Any]:
    """Each shown action's before/after images and what its undo read (``dashboard.presenters.images``)."""
    return images_by_action(actions, run_selectors.latest_undo_steps(actions=actions))


def _unknown_note(count: int) -> str:
    return f"{count} not shown with an unknown outcome" if count else ""


def _partial_marks(actions: list[Action], kept_ids: set[str]) -> dict[str, set[str]]:
    """After a partial compensation, each action of its plan is marked "kept" or "undone"."""
    undone = {a.pk for a in actions if a.status == Action.Status.COMPENSATED} if kept_ids else set()
    return {"kept_ids": kept_ids, "undone_ids": undone}


def _run_to_operate(request: HtmxHttpRequest, run_id: str) -> Run | HttpResponse:
    """The run an operator decides about from its page, or the page that says it is not there
    when the user cannot see it; refuses one whose tenant the user does not operate."""
    run = run_selectors.page_run(reach=reach_for(request.user), run_id=run_id)
    if run is None:
        return common.run_missing(request, run_id)
    require(request.user, Capability.OPERATE, run.tenant_id)
    return run


@require_http_methods(["GET", "POST"])
@login_required
def run_flag(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Flag a run for review (any run, also a succeeded one): GET shows what will happen, POST
    puts it in the recovery queue, where it is compensated, resumed or closed like a failed run."""
    run = _run_to_operate(request, run_id)
    if isinstance(run, HttpResponse):
        return run
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            item = resolutions.run_flag(
                run=run, actor=common.actor(request), reason=form.cleaned_data["reason"]
            )
        except SagaError as exc:
            return common.refused(request, exc, common.run_url(run.pk))
        messages.success(
            request,
            f"Flagged for review: the run is in the recovery queue ({item.get_reason_display().lower()}); "
            "nothing was undone. Decide below: compensate (all or some actions), resume or close.",
        )
        return common.done(request, common.run_url(run.pk))
    open_item = RecoveryItem.objects.filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
    return common.render_preview(
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
def run_cancel(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Cancel a run: GET shows exactly what will happen (the confirmation), POST does it."""
    run = _run_to_operate(request, run_id)
    if isinstance(run, HttpResponse):
        return run
    form = ReasonForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            outcome = cancellations.run_cancel(
                run=run, actor=common.actor(request), reason=form.cleaned_data["reason"]
            )
        except SagaError as exc:
            return common.refused(request, exc, common.run_url(run.pk))
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
        return common.done(request, common.run_url(run.pk))
    return common.render_preview(
        request,
        "dashboard/run_cancel.html",
        {"run": run, "preview": recovery_selectors.cancel_preview(run=run), "form": form},
    )
