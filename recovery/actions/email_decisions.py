"""Deciding an approval with an e-mail's link (``recovery.notifications.email_links``), confirmed on its page:
the link's nonce is recorded, once, in the transaction of the decision, and the decision goes
through the approvals' own services (``recovery.actions.approvals``), so every rule of a decision
holds unchanged (four eyes, one grant per person, escalation, bound to the arguments shown).
Every event it writes is marked ``via: email``.
"""

from __future__ import annotations

import structlog
from django.db import IntegrityError, transaction

from infra import errors
from ledger.audit import Actor, audit_context
from recovery.actions import approvals
from recovery.models import Approval, EmailLinkUse
from recovery.notifications.email_links import DecisionLink

log = structlog.get_logger(__name__)

# What an e-mail decision's events carry in their data: the channel it came through.
VIA_EMAIL = {"via": "email"}


class LinkUsed(Exception):
    """The link decided (or was refused) once already: it does nothing again."""


def approval_decide_by_email(
    *, link: DecisionLink, approval: Approval, actor: Actor, note: str = ""
) -> Approval:
    """``actor``'s (the link's person's) approval or rejection of ``approval``, as the link asks.
    Its nonce is taken first (a second use, even one racing this one, gets ``LinkUsed``); then the
    decision, by ``approval_decide_press``, approves only the arguments the e-mail was made for,
    and a rejection of arguments that changed since is refused too (409
    ``approval_args_changed``): the link stood for what the e-mail showed. A refusal
    (``SagaError``, raised unchanged) still uses the link up, and is audited as every refused
    decision is. The reason on the record: "Approved via e-mail by <username>" and the note."""
    verb = "Approved" if link.approve else "Rejected"
    reason = f"{verb} via e-mail by {actor.label}" + (f": {note.strip()}" if note.strip() else "")
    refusal: errors.SagaError | None = None
    decided = approval
    with transaction.atomic():
        try:
            with transaction.atomic():
                EmailLinkUse.objects.create(
                    nonce=link.nonce, approval_id=approval.pk, user_id=link.user_id, decision=link.decision
                )
        except IntegrityError:
            raise LinkUsed from None
        try:
            with audit_context(**VIA_EMAIL):
                if not link.approve:
                    _same_args(approval, link)
                decided = approvals.approval_decide_press(
                    approval=approval,
                    actor=actor,
                    approve=link.approve,
                    shown_args_hash=link.args_hash,
                    reason=reason,
                )
        except errors.SagaError as exc:
            # Committed with the link's use: a refused link is used up too.
            refusal = exc
    if refusal is not None:
        log.info("email_link.refused", approval_id=approval.pk, code=refusal.code, user=link.user_id)
        raise refusal
    log.info("email_link.decided", approval_id=approval.pk, decision=link.decision, user=link.user_id)
    return decided


def _same_args(approval: Approval, link: DecisionLink) -> None:
    current = Approval.objects.values_list("args_hash", flat=True).get(pk=approval.pk)
    if current != link.args_hash:
        raise errors.Conflict(
            "The arguments changed since this e-mail was sent; review them again in the inbox.",
            details={"approval_id": approval.pk, "args_hash": current},
            code="approval_args_changed",
        )
