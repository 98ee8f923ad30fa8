"""Approve and Reject links in approval e-mails. An e-mail about a pending approval (asked for,
reminded, escalated) to an address of a person who may decide it — an active member of the
approval's tenant with the approver or admin role whose account has that address — carries one
Approve and one Reject link made for that person alone; every other address gets the same e-mail
with the inbox's link only (``recovery.notifications.delivery``).

A link is a token signed by the installation (``SECRET_KEY``, a salt of its own) carrying the
approval, the person (a user id), the choice, the arguments' hash and a random nonce; it expires
``SAGA_EMAIL_LINK_TTL_MIN`` minutes after it was made, and is used at most once (its nonce is
recorded with the decision: ``recovery.models.EmailLinkUse``). Nothing is stored when a link is
made. Opening it never decides: it shows a confirmation page (``dashboard.views.email_decision``)
and the decision is the POST from that page, through ``recovery.actions.email_decisions``.

A link decides without a session only for an approval of at most ``SAGA_EMAIL_LINK_MAX_RISK``;
above it the page signs the person in first (single sign-on where configured) and then comes
back, and only that person, signed in as themself, confirms it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.core import signing
from django.db.models.functions import Lower
from django.urls import reverse

from infra.conf import saga
from ledger.models import RISK_ORDER, Membership, Risk
from ledger.services.keys import APPROVER_ROLES
from recovery.models import Approval, Notification, NotificationEvent
from recovery.notifications.outbox import public_url

_SALT = "saga.email.decision-link"
# A token is a few hundred characters; anything much longer was not made here.
TOKEN_MAX_CHARS = 1000

# The e-mails that carry decision links: those about an approval still waiting for a person.
LINKED_EVENTS = frozenset(
    {
        NotificationEvent.APPROVAL_REQUESTED,
        NotificationEvent.APPROVAL_REMINDER,
        NotificationEvent.APPROVAL_ESCALATED,
    }
)

APPROVE = "approve"
REJECT = "reject"


@dataclass(frozen=True)
class DecisionLink:
    """What one link stands for: this person's approval or rejection of this approval as its
    arguments were (``args_hash``) when the e-mail was made."""

    approval_id: str
    user_id: int
    approve: bool
    args_hash: str
    nonce: str

    @property
    def decision(self) -> str:
        return APPROVE if self.approve else REJECT


def ttl_min() -> int:
    """How many minutes a link stays valid (0: no decision links are sent)."""
    return saga().email_link_ttl_min


def link_token(link: DecisionLink) -> str:
    return signing.dumps(
        {"a": link.approval_id, "u": link.user_id, "d": link.decision, "h": link.args_hash, "n": link.nonce},
        salt=_SALT,
    )


# Why a token stands for no link: never made here (or altered), or made longer ago than it lives.
UNKNOWN = "unknown"
EXPIRED = "expired"


def link_from_token(token: str) -> tuple[DecisionLink | None, str]:
    """(the link, "") for a token made here within ``ttl_min()`` minutes; (None, ``EXPIRED``) for
    one made earlier; (None, ``UNKNOWN``) for anything else: forged, altered, cut, or of another
    salt (a Slack confirmation's token is not an e-mail link)."""
    if len(token) > TOKEN_MAX_CHARS:
        return None, UNKNOWN
    try:
        data = signing.loads(token, salt=_SALT, max_age=max(1, ttl_min()) * 60)
    except signing.SignatureExpired:
        return None, EXPIRED
    except signing.BadSignature:
        return None, UNKNOWN
    if not isinstance(data, dict):
        return None, UNKNOWN
    approval_id, user_id, decision = data.get("a"), data.get("u"), data.get("d")
    args_hash, nonce = data.get("h"), data.get("n")
    if not (isinstance(approval_id, str) and isinstance(user_id, int) and decision in (APPROVE, REJECT)):
        return None, UNKNOWN
    if not (isinstance(args_hash, str) and isinstance(nonce, str) and nonce):
        return None, UNKNOWN
    return DecisionLink(approval_id, user_id, decision == APPROVE, args_hash, nonce), ""


def decides_without_session(risk: str) -> bool:
    """Whether a link decides an approval of ``risk`` without a session: at most
    ``SAGA_EMAIL_LINK_MAX_RISK`` (``none``: never)."""
    highest = saga().email_link_max_risk
    if highest not in RISK_ORDER or risk not in RISK_ORDER:
        return False
    return RISK_ORDER[Risk(risk)] <= RISK_ORDER[Risk(highest)]


def deciders(*, tenant_id: int, addresses: list[str]) -> dict[str, int]:
    """Of ``addresses``, those that belong to a person who may decide the tenant's approvals: an
    active member with the approver or admin role whose account has the address, case aside.
    Address (as given) → that person's user id; the lowest id when several such accounts share
    the address (one person: ``recovery.transitions.approvals.same_person``)."""
    wanted = {address.strip().lower(): address for address in addresses if address.strip()}
    if not wanted:
        return {}
    found = (
        Membership.objects.filter(tenant_id=tenant_id, role__in=APPROVER_ROLES, user__is_active=True)
        .annotate(address=Lower("user__email"))
        .filter(address__in=list(wanted))
        .order_by("user_id")
        .values_list("address", "user_id")
    )
    people: dict[str, int] = {}
    for address, user_id in found:
        people.setdefault(wanted[address], user_id)
    return people


def linked_approval(row: Notification) -> Approval | None:
    """The approval ``row`` is about, when its e-mail carries decision links: links are on
    (``SAGA_EMAIL_LINK_TTL_MIN`` above 0), the event is about an approval waiting, and it still
    is (pending)."""
    approval_id = str(row.context.get("approval_id") or "")
    if not approval_id or row.event not in LINKED_EVENTS or ttl_min() <= 0:
        return None
    return Approval.objects.filter(
        pk=approval_id, tenant_id=row.tenant_id, status=Approval.Status.PENDING
    ).first()


def link_url(link: DecisionLink) -> str:
    return public_url(reverse("dashboard:email-decision", args=[link_token(link)]))


def decision_lines(approval: Approval, *, user_id: int) -> list[str]:
    """The lines one person's e-mail adds: their Approve and Reject links (new ones, with nonces
    of their own, each time an e-mail is made) and what opening one does."""
    made = {
        choice: link_url(
            DecisionLink(
                approval_id=approval.pk,
                user_id=user_id,
                approve=choice == APPROVE,
                args_hash=approval.args_hash,
                nonce=secrets.token_urlsafe(16),
            )
        )
        for choice in (APPROVE, REJECT)
    }
    session = (
        "without signing in"
        if decides_without_session(approval.risk)
        else "after you sign in (this approval's risk asks for it)"
    )
    return [
        f"Decide from here: each link opens a page that shows the arguments and asks you to confirm, "
        f"{session}. The links are yours alone, work once, and for {ttl_min()} minutes; after that, "
        "open the inbox.",
        f"Approve: {made[APPROVE]}",
        f"Reject: {made[REJECT]}",
    ]
