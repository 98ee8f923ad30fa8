"""The approval inbox: pending approvals as cards (``dashboard.presenters.approval_cards``), one
page at a time, and approving or rejecting one (a whole card back for htmx, with the nav badge).
``?approval=ID`` shows that one approval's card, whatever its status (a link from a Teams card),
and ``&decide=approve`` or ``reject`` says which decision was chosen there, for the signed-in
person to confirm with the card's own form: a GET never decides."""

from __future__ import annotations

import re
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from dashboard.forms import ApproveForm, ReasonForm
from dashboard.permissions import Capability, can, require
from dashboard.presenters import approval_cards
from dashboard.selectors import away as away_selectors
from dashboard.selectors import inbox as inbox_selectors
from dashboard.selectors import live
from dashboard.templatetags.dashboard import pretty_json
from dashboard.views import common
from dashboard.views.common import HtmxHttpRequest
from infra.errors import SagaError
from recovery import decisions as recovery_decisions
from recovery import teams
from recovery.actions import approvals as approval_actions
from recovery.models import Approval
from recovery.transitions import approvals as recovery_approvals


def _get_approval_for_user(request: HttpRequest, approval_id: str, capability: Capability) -> Approval:
    approval = common.get_or_404(
        Approval.objects.select_related("run__tenant", *inbox_selectors.APPROVAL_CARD_RELATED),
        approval_id,
        request,
    )
    require(request.user, capability, approval.tenant_id)
    return approval


def _keys_owned(request: HttpRequest) -> recovery_approvals.OwnedKeys:
    """The keys the signed-in person owns (they asked through them too), read once per request
    however many cards ask."""
    owned: recovery_approvals.OwnedKeys | None = getattr(request, "_saga_keys_owned", None)
    if owned is None:
        owned = recovery_approvals.keys_owned(recovery_approvals.person_of(common.actor(request)))
        request._saga_keys_owned = owned  # type: ignore[attr-defined]
    return owned


def _people(request: HttpRequest) -> frozenset[int]:
    """Every account of the signed-in person (``recovery.transitions.approvals.same_person``), read once per
    request however many cards ask."""
    people: frozenset[int] | None = getattr(request, "_saga_people", None)
    if people is None:
        people = recovery_approvals.same_person(recovery_approvals.person_of(common.actor(request)))
        request._saga_people = people  # type: ignore[attr-defined]
    return people


def _approval_card(request: HtmxHttpRequest, approval: Approval, **extra: Any) -> dict[str, Any]:
    escalated_away = (
        approval.status == Approval.Status.PENDING
        and approval.escalated_at is not None
        and not recovery_approvals.escalation_approver(approval, common.actor(request))
    )
    return {
        "approval": approval,
        # What the card says will happen: computed in one place, the template only renders it.
        "content": approval_cards.approval_card_content(approval),
        "approve_form": extra.pop("approve_form", None)
        or ApproveForm(
            initial={
                "args": pretty_json(approval.args) if approval.args is not None else "",
                "shown_args_hash": approval.args_hash,
            },
            prefix=approval.pk,
        ),
        "reject_form": extra.pop("reject_form", None) or ReasonForm(prefix=f"{approval.pk}-reject"),
        "can_decide": can(request.user, Capability.APPROVE, approval.tenant_id) and not escalated_away,
        # Escalated to others: since its deadline passed, only they decide it.
        "escalated_away": escalated_away,
        # Handed over from an away person (``recovery.transitions.delegation``): until when they are away.
        "delegated_until": away_selectors.delegated_from_until(approval) if approval.delegated_from else None,
        # Whoever asked may reject but never grant (the service refuses: self_approval).
        "own_request": recovery_approvals.is_requester(
            approval, common.actor(request), owned=_keys_owned(request), people=_people(request)
        ),
        **extra,
    }


@require_GET
@login_required
def approvals(request: HtmxHttpRequest) -> HttpResponse:
    if "approval" in request.GET:
        return _one_approval(request)
    cursor = request.GET.get("cursor", "")
    page = inbox_selectors.approvals_pending(user=request.user, cursor=cursor)
    context = {
        "cards": [_approval_card(request, approval) for approval in page.approvals],
        "next_cursor": page.next_cursor,
        "paged": bool(cursor),
        # The signed-in person's aways and the ones they cover (``dashboard.selectors.away``).
        "away_notes": away_selectors.away_notes(request.user) if isinstance(request.user, User) else [],
    }
    if request.htmx and request.htmx.target == "approvals-more":
        return render(request, "dashboard/approvals.html#approval-cards", context)
    return render(request, "dashboard/approvals.html", context)


# What an approval id looks like (``apr_`` and a ULID); anything else is no approval, unread.
_ID = re.compile(r"[A-Za-z0-9_]{1,40}")


def _one_approval(request: HtmxHttpRequest) -> HttpResponse:
    """One approval's card (404 outside the user's tenants), with the decision a link chose
    (``decide``; anything else is ignored) named above its form, for the person to confirm."""
    approval_id = request.GET.get("approval", "")
    if not _ID.fullmatch(approval_id):
        raise Http404("No such approval.")
    approval = common.get_or_404(
        Approval.objects.select_related("run__tenant", *inbox_selectors.APPROVAL_CARD_RELATED),
        approval_id,
        request,
    )
    decide = request.GET.get("decide", "")
    card = _approval_card(request, approval, decide=decide if decide in teams.DECISIONS else "")
    context = {"cards": [card], "next_cursor": "", "paged": False, "one": approval}
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
                decided = approval_actions.approval_approve(
                    approval=approval,
                    actor=common.actor(request),
                    reason=form.cleaned_data["reason"],
                    args=form.cleaned_data["args"],
                    shown_args_hash=form.cleaned_data["shown_args_hash"],
                )
                if decided.status == Approval.Status.PENDING:
                    granted = (
                        f"Your grant is recorded ({approval_cards.grants_line(decided)}); "
                        "another approver must grant it too."
                    )
            else:
                approval_actions.approval_reject(
                    approval=approval, actor=common.actor(request), reason=form.cleaned_data["reason"]
                )
        except SagaError as exc:
            error = recovery_decisions.refusal_sentence(exc)
    else:
        error = common.form_errors(form)
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
