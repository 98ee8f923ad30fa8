"""What the demo world's systems do: forward operations, their compensations, and the edits people
make by hand. The HTTP endpoints (``demo.views``) and the Python compensators
(``demo.compensators``) both call these, so a webhook and a Python compensator behave the same.

Every function returns a ``WorldResult``: an HTTP-like status and a JSON body. Compensations
follow the webhook protocol's meanings: 2xx done (``{"state": …}`` is the record afterwards),
409 already compensated, 412 the record drifted from the action's after snapshot (a person
changed it since; overwriting their change is not ours to decide), other 4xx refused.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from demo.models import (
    CrmContact,
    CrmTicket,
    HrUser,
    OutboxEmail,
    Payment,
    Refund,
    WorkspaceLicense,
    WorldRequest,
)
from infra.hashing import sha256_hex

LICENSE_PRICES_CENTS = {"business-starter": 700, "business-standard": 1400, "business-plus": 2200}
TICKET_PRIORITIES = ("low", "normal", "high", "urgent")


@dataclass(frozen=True)
class WorldResult:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def _error(status: int, code: str, message: str, **details: Any) -> WorldResult:
    return WorldResult(status, {"error": {"code": code, "message": message, "details": details}})


def _state(record: Any, *, missing: str) -> WorldResult:
    """A read's answer: the record's snapshot as its state, or 404 ``not_found`` saying what is
    ``missing``."""
    if record is None:
        return _error(404, "not_found", missing)
    return WorldResult(200, {"state": record.snapshot()})


def _drifted(*, expected: Any, actual: Any, what: str) -> WorldResult:
    return _error(
        412,
        "drifted",
        f"{what} changed since the agent's action; not overwriting it.",
        expected=expected,
        actual=actual,
    )


def _matches(current: dict[str, Any], after: Any) -> bool:
    """Does the record still look as the action left it? Only the keys the after snapshot has are
    compared: a snapshot taken by an older version of the tool may know fewer fields."""
    if not isinstance(after, dict):
        return True  # no after snapshot recorded: nothing to compare against
    return all(current.get(key) == value for key, value in after.items())


# --- Idempotency -----------------------------------------------------------------------------


def world_call(*, operation: str, key: str, payload: Any, perform: Callable[[], WorldResult]) -> WorldResult:
    """Run ``perform`` at most once per Idempotency-Key.

    The effect and the stored answer commit in one transaction, and concurrent calls with the
    same key are serialised by an advisory lock, so a retry that races the first call waits and
    then gets the first call's answer. Only successes are stored: a refusal (409, 412, 422) has no
    effect to protect, and the same step retried after a person fixed the record must be looked
    at afresh.
    """
    if not key:
        with transaction.atomic():
            return perform()
    request_hash = sha256_hex({"operation": operation, "payload": payload})
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"demo-world:{key}"])
        stored = WorldRequest.objects.filter(key=key).first()
        if stored is not None:
            if stored.request_hash != request_hash:
                return _error(
                    422,
                    "idempotency_key_reused",
                    "This Idempotency-Key was already used for a different request.",
                    key=key,
                )
            return WorldResult(stored.status_code, stored.body, replayed=True)
        result = perform()
        if result.ok:
            WorldRequest.objects.create(
                key=key,
                operation=operation,
                request_hash=request_hash,
                status_code=result.status,
                body=result.body,
            )
        return result


# --- HR directory ----------------------------------------------------------------------------


def hr_user_create(
    *,
    email: str,
    name: str,
    department: str = "",
    title: str = "",
    manager: str = "",
    start_date: str | None = None,
    tenant: str = "",
) -> WorldResult:
    if "@" not in email or not name:
        return _error(422, "invalid_user", "A user needs an email address and a name.", email=email)
    try:
        start = date.fromisoformat(start_date) if start_date else None
    except ValueError:
        return _error(422, "invalid_start_date", f"start_date must be YYYY-MM-DD, got {start_date!r}.")
    existing = HrUser.objects.select_for_update().filter(email=email).first()
    if existing is not None:
        return _error(409, "user_exists", f"{email} already has an HR record.", state=existing.snapshot())
    user = HrUser.objects.create(
        email=email,
        name=name,
        department=department,
        title=title,
        manager=manager,
        start_date=start,
        tenant_slug=tenant,
    )
    return WorldResult(201, {"state": user.snapshot()})


def hr_user_delete(*, email: str, after_snapshot: Any = None) -> WorldResult:
    user = HrUser.objects.select_for_update().filter(email=email).first()
    if user is None:
        return _error(409, "already_deleted", f"{email} has no HR record (already deleted).")
    if not _matches(user.snapshot(), after_snapshot):
        return _drifted(expected=after_snapshot, actual=user.snapshot(), what=f"HR record {email}")
    user.delete()
    return WorldResult(200, {"state": {"email": email, "deleted": True}})


def hr_user_read(*, email: str) -> WorldResult:
    return _state(HrUser.objects.filter(email=email).first(), missing=f"No HR record for {email}.")


def hr_user_edit_by_person(*, email: str, who: str, **changes: Any) -> WorldResult:
    """An HR person edits the record in the HR system's own UI (no agent involved)."""
    user = HrUser.objects.select_for_update().filter(email=email).first()
    if user is None:
        return _error(404, "not_found", f"No HR record for {email}.")
    for name, value in changes.items():
        setattr(user, name, value)
    user.save()
    return WorldResult(200, {"state": user.snapshot(), "edited_by": who})


TITLE_MAX_LENGTH = 200


def _title_refused(title: Any) -> WorldResult | None:
    """A job title's refusal (422 ``invalid_title``), or None: one line of text, not blank."""
    if not isinstance(title, str) or not title.strip():
        return _error(422, "invalid_title", "A job title is required (a text that is not blank).")
    if len(title) > TITLE_MAX_LENGTH:
        return _error(422, "invalid_title", f"A job title is at most {TITLE_MAX_LENGTH} characters.")
    if any(char in title for char in "\r\n\t"):
        return _error(422, "invalid_title", "A job title is one line of text.", title=title)
    return None


def hr_user_update_title(*, email: str, title: Any) -> WorldResult:
    """hr.update_title: change a person's job title. The answer's state is the whole record after
    the change (what the agent records as its after snapshot)."""
    refused = _title_refused(title)
    if refused is not None:
        return refused
    user = HrUser.objects.select_for_update().filter(email=email).first()
    if user is None:
        return _error(404, "not_found", f"No HR record for {email}.")
    user.title = title
    user.save(update_fields=["title", "updated_at"])
    return WorldResult(200, {"state": user.snapshot()})


def hr_title_restore(*, email: str, title: Any, after_snapshot: Any = None) -> WorldResult:
    """The undo of hr.update_title: put the title back to ``title`` (the before-image's), unless
    the record no longer looks as the agent left it (412: someone changed it since, and their
    change is not ours to overwrite) or already has that title (409)."""
    refused = _title_refused(title)
    if refused is not None:
        return refused
    user = HrUser.objects.select_for_update().filter(email=email).first()
    if user is None:
        return _error(404, "not_found", f"No HR record for {email}.")
    if user.title == title:
        return _error(
            409, "already_restored", f"{email} already has the title {title!r}.", state=user.snapshot()
        )
    if not _matches(user.snapshot(), after_snapshot):
        return _drifted(expected=after_snapshot, actual=user.snapshot(), what=f"HR record {email}")
    user.title = title
    user.save(update_fields=["title", "updated_at"])
    return WorldResult(200, {"state": user.snapshot()})


# --- Workspace licences ----------------------------------------------------------------------


def license_provision(*, email: str, sku: str, tenant: str = "") -> WorldResult:
    if sku not in LICENSE_PRICES_CENTS:
        return _error(422, "unknown_sku", f"Unknown SKU {sku!r}.", allowed=sorted(LICENSE_PRICES_CENTS))
    if not HrUser.objects.filter(email=email).exists():
        return _error(422, "no_hr_record", f"{email} has no HR record; create the user first.")
    if (
        WorkspaceLicense.objects.select_for_update()
        .filter(email=email, status=WorkspaceLicense.Status.ACTIVE)
        .exists()
    ):
        return _error(409, "license_exists", f"{email} already holds an active licence.")
    lic = WorkspaceLicense.objects.create(
        email=email, sku=sku, monthly_cost_cents=LICENSE_PRICES_CENTS[sku], tenant_slug=tenant
    )
    return WorldResult(201, {"state": lic.snapshot()})


def license_cancel(*, email: str, after_snapshot: Any = None) -> WorldResult:
    latest = (
        WorkspaceLicense.objects.select_for_update()
        .filter(email=email)
        .order_by("-created_at", "-pk")
        .first()
    )
    if latest is None:
        return _error(404, "not_found", f"{email} never held a licence.")
    if latest.status == WorkspaceLicense.Status.CANCELLED:
        return _error(409, "already_cancelled", f"The licence of {email} is already cancelled.")
    if isinstance(after_snapshot, dict) and after_snapshot.get("license_id") not in (None, latest.pk):
        return _drifted(expected=after_snapshot, actual=latest.snapshot(), what=f"The licence of {email}")
    latest.status = WorkspaceLicense.Status.CANCELLED
    latest.cancelled_at = timezone.now()
    latest.save(update_fields=["status", "cancelled_at"])
    return WorldResult(200, {"state": latest.snapshot()})


# --- Email -----------------------------------------------------------------------------------


def _address_ok(address: str) -> bool:
    local, _, domain = address.partition("@")
    return bool(local) and "." in domain and "@" not in domain and " " not in address


def email_send(*, to: str, subject: str, body: str, tenant: str = "") -> WorldResult:
    if not _address_ok(to):
        return _error(
            422, "invalid_recipient", f"Cannot deliver to {to!r}: not a valid email address.", to=to
        )
    message = OutboxEmail.objects.create(
        to=to, subject=subject, body=body, kind=OutboxEmail.Kind.SENT, tenant_slug=tenant
    )
    return WorldResult(201, {"state": message.snapshot()})


def email_draft_create(*, to: str, subject: str, body: str, tenant: str = "") -> WorldResult:
    message = OutboxEmail.objects.create(
        to=to, subject=subject, body=body, kind=OutboxEmail.Kind.DRAFT, tenant_slug=tenant
    )
    return WorldResult(201, {"state": message.snapshot()})


def email_draft_discard(*, message_id: int) -> WorldResult:
    message = OutboxEmail.objects.select_for_update().filter(pk=message_id).first()
    if message is None:
        return _error(404, "not_found", f"No message {message_id}.")
    if message.kind == OutboxEmail.Kind.DISCARDED:
        return _error(409, "already_discarded", f"Draft {message_id} is already discarded.")
    if message.kind == OutboxEmail.Kind.SENT:
        return _drifted(
            expected={"kind": "draft"}, actual=message.snapshot(), what=f"Message {message_id} (sent since)"
        )
    message.kind = OutboxEmail.Kind.DISCARDED
    message.save(update_fields=["kind"])
    return WorldResult(200, {"state": message.snapshot()})


def email_send_correction(*, message_id: int, body: str = "") -> WorldResult:
    """A sent email cannot be unsent; the correction is a follow-up to the same recipient."""
    original = OutboxEmail.objects.select_for_update().filter(pk=message_id).first()
    if original is None:
        return _error(404, "not_found", f"No message {message_id}.")
    if original.kind != OutboxEmail.Kind.SENT:
        return _error(422, "not_sent", f"Message {message_id} was never sent; there is nothing to correct.")
    if OutboxEmail.objects.filter(corrects=original).exists():
        return _error(409, "already_corrected", f"Message {message_id} already has a correction.")
    correction = OutboxEmail.objects.create(
        to=original.to,
        subject=f"Correction: {original.subject}",
        kind=OutboxEmail.Kind.SENT,
        corrects=original,
        tenant_slug=original.tenant_slug,  # the correction belongs with what it corrects
        body=body
        or (
            f'Please disregard our earlier message "{original.subject}": it was sent in error. '
            "We are sorry for the confusion."
        ),
    )
    return WorldResult(201, {"state": correction.snapshot()})


# --- CRM -------------------------------------------------------------------------------------


def ticket_read(*, ticket_id: str) -> WorldResult:
    return _state(CrmTicket.objects.filter(pk=ticket_id).first(), missing=f"No ticket {ticket_id}.")


def _edit_refused(changes: dict[str, Any], *, editable: tuple[str, ...], what: str) -> WorldResult | None:
    """A CRM edit's refusal (422), or None: only the record's editable fields, each a text."""
    unknown = sorted(set(changes) - set(editable))
    if unknown:
        return _error(422, "not_editable", f"Fields {', '.join(unknown)} cannot be changed.", fields=unknown)
    if not all(isinstance(value, str) for value in changes.values()):
        return _error(422, "invalid_value", f"{what} fields take text values.")
    return None


def _ticket_changes(changes: dict[str, Any]) -> WorldResult | None:
    refused = _edit_refused(changes, editable=CrmTicket.EDITABLE, what="Ticket")
    if refused is not None:
        return refused
    if "priority" in changes and changes["priority"] not in TICKET_PRIORITIES:
        return _error(422, "invalid_priority", f"priority must be one of {', '.join(TICKET_PRIORITIES)}.")
    return None


def ticket_update(*, ticket_id: str, changes: dict[str, Any], by: str) -> WorldResult:
    refused = _ticket_changes(changes)
    if refused is not None:
        return refused
    ticket = CrmTicket.objects.select_for_update().filter(pk=ticket_id).first()
    if ticket is None:
        return _error(404, "not_found", f"No ticket {ticket_id}.")
    for name, value in changes.items():
        setattr(ticket, name, value)
    ticket.updated_by = by
    ticket.save()
    return WorldResult(200, {"state": ticket.snapshot()})


def _restore(record: Any, *, editable: tuple[str, ...], before: Any, after: Any, what: str) -> WorldResult:
    """Put ``record``'s editable fields back to the before snapshot, unless someone changed the
    record since the action (412) or it already holds the earlier values (409). The caller has
    the row locked."""
    if not isinstance(before, dict):
        return _error(422, "no_snapshot", "A restore needs the action's before snapshot.")
    current = record.snapshot()
    wanted = {name: before[name] for name in editable if name in before}
    if all(current[name] == value for name, value in wanted.items()):
        return _error(409, "already_restored", f"{what} already has its earlier values.")
    if not _matches(current, after):
        return _drifted(expected=after, actual=current, what=what)
    for name, value in wanted.items():
        setattr(record, name, value)
    return WorldResult(200, {})


def ticket_restore(*, ticket_id: str, before_snapshot: Any, after_snapshot: Any) -> WorldResult:
    ticket = CrmTicket.objects.select_for_update().filter(pk=ticket_id).first()
    if ticket is None:
        return _error(404, "not_found", f"No ticket {ticket_id}.")
    result = _restore(
        ticket,
        editable=CrmTicket.EDITABLE,
        before=before_snapshot,
        after=after_snapshot,
        what=f"Ticket {ticket_id}",
    )
    if not result.ok:
        return result
    ticket.updated_by = "saga-admin (restore)"
    ticket.save()
    return WorldResult(200, {"state": ticket.snapshot()})


def contact_read(*, contact_id: str) -> WorldResult:
    return _state(CrmContact.objects.filter(pk=contact_id).first(), missing=f"No contact {contact_id}.")


CONTACT_EDITABLE = ("tier", "owner", "email")


def contact_update(*, contact_id: str, changes: dict[str, Any]) -> WorldResult:
    refused = _edit_refused(changes, editable=CONTACT_EDITABLE, what="Contact")
    if refused is not None:
        return refused
    contact = CrmContact.objects.select_for_update().filter(pk=contact_id).first()
    if contact is None:
        return _error(404, "not_found", f"No contact {contact_id}.")
    for name, value in changes.items():
        setattr(contact, name, value)
    contact.save()
    return WorldResult(200, {"state": contact.snapshot()})


def contact_restore(*, contact_id: str, before_snapshot: Any, after_snapshot: Any) -> WorldResult:
    contact = CrmContact.objects.select_for_update().filter(pk=contact_id).first()
    if contact is None:
        return _error(404, "not_found", f"No contact {contact_id}.")
    result = _restore(
        contact,
        editable=CONTACT_EDITABLE,
        before=before_snapshot,
        after=after_snapshot,
        what=f"Contact {contact_id}",
    )
    if not result.ok:
        return result
    contact.save()
    return WorldResult(200, {"state": contact.snapshot()})


# --- Payments --------------------------------------------------------------------------------


def payment_charge(
    *, customer: str, amount_cents: int, currency: str = "USD", description: str = "", tenant: str = ""
) -> WorldResult:
    if not isinstance(amount_cents, int) or amount_cents <= 0:
        return _error(422, "invalid_amount", "amount_cents must be a positive integer.")
    payment = Payment.objects.create(
        id=f"pay_{secrets.token_hex(6)}",
        customer=customer,
        amount_cents=amount_cents,
        currency=currency,
        description=description,
        tenant_slug=tenant,
    )
    return WorldResult(201, {"state": payment.snapshot()})


def payment_refund(*, payment_id: str, amount_cents: int | None = None, reason: str = "") -> WorldResult:
    """Refund ``amount_cents`` (default: whatever is left) of a payment."""
    payment = Payment.objects.select_for_update().filter(pk=payment_id).first()
    if payment is None:
        return _error(404, "not_found", f"No payment {payment_id}.")
    if payment.disputed:
        return _error(
            422,
            "payment_disputed",
            f"Payment {payment_id} is under a chargeback dispute; "
            "the processor blocks refunds until it resolves.",
        )
    left = payment.amount_cents - payment.refunded_cents
    if left == 0:
        return _error(409, "already_refunded", f"Payment {payment_id} is already fully refunded.")
    amount = left if amount_cents is None else amount_cents
    if not isinstance(amount, int) or amount <= 0 or amount > left:
        return _error(
            422, "invalid_amount", f"Refund must be between 1 and {left} cents.", refundable_cents=left
        )
    Refund.objects.create(payment=payment, amount_cents=amount, reason=reason)
    payment.refunded_cents += amount
    payment.status = (
        Payment.Status.REFUNDED
        if payment.refunded_cents == payment.amount_cents
        else (Payment.Status.PARTIALLY_REFUNDED)
    )
    payment.save(update_fields=["refunded_cents", "status"])
    return WorldResult(201, {"state": payment.snapshot()})
