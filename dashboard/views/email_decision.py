"""The page an approval e-mail's Approve or Reject link opens (``recovery.notifications.email_links``).

``GET`` (and ``HEAD``) only shows: the approval as it is now, its exact arguments, and a button
to confirm the choice — a mail scanner or a browser's prefetch that follows the link decides
nothing. ``POST`` from that page (Django's CSRF check, and the signed link in its URL) decides,
through ``recovery.actions.email_decisions``. Every refusal is a page that says why, with a
status code of its own, and decides nothing: an unknown link 404, an expired or used one 410, a
link of another person 403, an approval decided already or whose arguments changed 409.

A link decides without a session only for an approval of at most ``SAGA_EMAIL_LINK_MAX_RISK``;
above it the page sends the person to sign in (single sign-on where configured) and back here.
Whoever is signed in must be the link's person (any of their accounts) at every risk."""

from __future__ import annotations

import json
from typing import Any

import structlog
from django.contrib.auth import get_user_model
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from dashboard.permissions import Capability, reach_for, tenant_ids_with
from infra.errors import SagaError
from ledger.audit import Actor
from ledger.models import Membership
from ledger.rules import REASON_MAX_LENGTH
from ledger.services.keys import APPROVER_ROLES
from recovery.actions import email_decisions
from recovery.deadline_words import deadline_line
from recovery.decisions import refusal_sentence
from recovery.models import Approval, EmailLinkUse
from recovery.notifications import email_links
from recovery.transitions.approvals import same_person

log = structlog.get_logger(__name__)

TEMPLATE = "dashboard/email_decision.html"

# The longest note a person adds to the reason on the record (the reason's own words come first).
NOTE_MAX_LENGTH = REASON_MAX_LENGTH - 200


def _refusal(request: HttpRequest, sentence: str, status: int, *, why: str) -> HttpResponse:
    log.info("email_link.refused", why=why, status=status, method=request.method)
    return render(request, TEMPLATE, {"refusal": sentence}, status=status)


@require_http_methods(["GET", "HEAD", "POST"])
@never_cache  # the page shows an approval's arguments to whoever holds the link: kept nowhere
def email_decision(request: HttpRequest, link: str) -> HttpResponse:
    return _answer(request, link)


def _answer(request: HttpRequest, token: str) -> HttpResponse:
    link, why = email_links.link_from_token(token)
    if link is None:
        if why == email_links.EXPIRED:
            return _refusal(
                request,
                f"This link is older than {email_links.ttl_min()} minutes, so it no longer decides "
                "anything: nothing was decided. Open the approval inbox to decide.",
                410,
                why="expired",
            )
        return _refusal(
            request, "This link is not one Saga Admin made: nothing was decided.", 404, why="unknown"
        )
    signed_in = request.user.is_authenticated
    # Signed in, an approval of another tenant is not found (never reveal it exists).
    approvals = Approval.objects.select_related("run", "tenant")
    approval = (
        reach_for(request.user).first(approvals, link.approval_id)
        if signed_in
        else approvals.filter(pk=link.approval_id).first()
    )
    if approval is None:
        return _refusal(request, "No such approval among those you see.", 404, why="not_found")
    if not signed_in and not email_links.decides_without_session(approval.risk):
        # Above the risk a link decides alone: sign in (single sign-on where configured), then
        # back to this page.
        return redirect_to_login(request.get_full_path())
    if EmailLinkUse.objects.filter(nonce=link.nonce).exists():
        return _refusal(
            request,
            "This link was used already, and a link works once: nothing more was decided. Open the "
            "approval inbox to see the approval as it is now.",
            410,
            why="used",
        )
    person = _person(request, link)
    if isinstance(person, HttpResponse):
        return person
    if not _may_approve(person, approval, signed_in=signed_in):
        return _refusal(
            request,
            f"{person.get_username()} does not hold the approver role in {approval.tenant.name}: "
            "nothing was decided.",
            403,
            why="not_approver",
        )
    if refused := _stale(request, approval, link):
        return refused
    if request.method == "POST":
        return _decide(request, link, approval, person)
    return render(request, TEMPLATE, _page(approval, link, person, signed_in=signed_in))


def _stale(request: HttpRequest, approval: Approval, link: email_links.DecisionLink) -> HttpResponse | None:
    """The refusal of a link the approval moved past since its e-mail: decided, its arguments
    changed, or its deadline passed (None: the link still stands for the approval as it is)."""
    if approval.status != Approval.Status.PENDING:
        return _refusal(
            request,
            f"Approval {approval.pk} was {approval.get_status_display().lower()} already"
            f"{_by(approval)}: nothing more was decided.",
            409,
            why="decided",
        )
    if approval.args_hash != link.args_hash:
        return _refusal(
            request,
            "The arguments changed since this e-mail was sent: nothing was decided. Review them "
            "again in the approval inbox.",
            409,
            why="args_changed",
        )
    if approval.expires_at <= timezone.now():
        return _refusal(
            request,
            f"Approval {approval.pk} passed its deadline ({approval.expires_at:%Y-%m-%d %H:%M} UTC): "
            "nothing was decided.",
            409,
            why="past_deadline",
        )
    return None


def _person(request: HttpRequest, link: email_links.DecisionLink) -> Any:
    """The person deciding (a user), or the refusal: signed in, the link's person (through any
    of their accounts) and no one else; without a session, the link's person, still active."""
    if request.user.is_authenticated:
        if request.user.pk not in same_person(link.user_id):
            return _refusal(
                request,
                "This link was sent to another person: only they decide with it. You are signed in "
                f"as {request.user.get_username()}; nothing was decided. Decide in your own approval "
                "inbox.",
                403,
                why="another_person",
            )
        return request.user
    person = get_user_model().objects.filter(pk=link.user_id, is_active=True).first()
    if person is None:
        return _refusal(
            request,
            "The person this link was sent to can no longer sign in: nothing was decided.",
            403,
            why="inactive",
        )
    return person


def _may_approve(person: Any, approval: Approval, *, signed_in: bool) -> bool:
    if signed_in:
        return approval.tenant_id in tenant_ids_with(person, Capability.APPROVE)
    return Membership.objects.filter(
        user=person, tenant_id=approval.tenant_id, role__in=APPROVER_ROLES
    ).exists()


def _by(approval: Approval) -> str:
    who = approval.decided_by.get_username() if approval.decided_by_id and approval.decided_by else ""
    return f" by {who}" if who else ""


def _page(
    approval: Approval, link: email_links.DecisionLink, person: Any, *, signed_in: bool
) -> dict[str, Any]:
    granted = approval.grants.count() if approval.approvers_required > 1 else 0
    return {
        "approval": approval,
        "link": link,
        "person": person,
        "signed_in": signed_in,
        "deadline": deadline_line(approval),
        "granted": granted,
        "args": json.dumps(approval.args, indent=2, sort_keys=True, ensure_ascii=False),
        "note_max": NOTE_MAX_LENGTH,
    }


def _decide(
    request: HttpRequest, link: email_links.DecisionLink, approval: Approval, person: Any
) -> HttpResponse:
    note = request.POST.get("note", "").strip()
    if len(note) > NOTE_MAX_LENGTH:
        return _refusal(
            request,
            f"A note is at most {NOTE_MAX_LENGTH} characters; this one has {len(note)}. Nothing was "
            "decided and the link still works: go back and shorten it.",
            422,
            why="note_too_long",
        )
    try:
        decided = email_decisions.approval_decide_by_email(
            link=link, approval=approval, actor=Actor.for_user(person), note=note
        )
    except email_decisions.LinkUsed:
        return _refusal(
            request,
            "This link was used already, and a link works once: nothing more was decided.",
            410,
            why="used",
        )
    except SagaError as exc:
        return _refusal(request, f"Not decided: {refusal_sentence(exc)}", exc.status, why=exc.code)
    return render(
        request,
        TEMPLATE,
        {
            "done": decided,
            "person": person,
            "grant_only": link.approve and decided.status == Approval.Status.PENDING,
            "signed_in": request.user.is_authenticated,
        },
    )
