"""The demo world over HTTP: the "real systems" demo agents call, and the compensating endpoints
Saga Admin's webhook compensators call (API.md, "Compensators: the HTTP webhook protocol").

Every call must be signed with the world's secret (``X-Saga-Signature`` over
``X-Saga-Timestamp`` + "." + the raw body, the secret from ``SAGA_DEMO_WORLD_SECRET``: the same
variable the demo policy files name in ``secret_env``, so sender and receiver cannot disagree).
An ``Idempotency-Key`` makes a repeat harmless. These endpoints know nothing of the dashboard's
sessions: they are csrf-exempt and authenticate by signature alone.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from dashboard.permissions import tenants_for
from demo import services
from demo.models import CrmContact, CrmTicket, HrUser, OutboxEmail, Payment, WorkspaceLicense
from demo.services import WorldResult
from infra.signing import verify_signature

SECRET_ENV = "SAGA_DEMO_WORLD_SECRET"


def world_secret() -> str:
    return os.environ.get(SECRET_ENV, "")


class BadRequest(Exception):
    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


def _json(result: WorldResult) -> JsonResponse:
    response = JsonResponse(result.body, status=result.status)
    if result.replayed:
        response["Idempotent-Replayed"] = "true"
    return response


def _refusal(status: int, code: str, message: str, **details: Any) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "details": details}}, status=status)


Handler = Callable[[], WorldResult]


def world_endpoint(operation: str) -> Callable[[Callable[..., Handler]], Callable[..., HttpResponse]]:
    """Wrap a view that turns the request into a world operation: check the signature, parse the
    JSON body, and run the operation once per Idempotency-Key."""

    def decorate(view: Callable[..., Handler]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        def wrapped(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            secret = world_secret()
            if not secret:
                # Off unless configured: a production deployment that never set the variable
                # must not expose writable fake systems.
                return _refusal(503, "demo_world_disabled", f"The demo world is off: set {SECRET_ENV}.")
            if not verify_signature(secret, request.headers, request.body):
                return _refusal(401, "bad_signature", "Missing, stale or wrong X-Saga-Signature.")
            payload: dict[str, Any] = {}
            if request.method == "POST":
                try:
                    payload = json.loads(request.body or b"{}")
                except ValueError:
                    return _refusal(400, "invalid_json", "The body is not valid JSON.")
                if not isinstance(payload, dict):
                    return _refusal(400, "invalid_json", "The body must be a JSON object.")
            try:
                perform = view(request, payload, **kwargs)
            except BadRequest as exc:
                return _refusal(422, "invalid_request", str(exc), **exc.details)
            key = request.headers.get("Idempotency-Key", "") if request.method == "POST" else ""
            # A retry sends the same step with the next ``attempt``: the same request for the
            # Idempotency-Key's purpose (its first answer), not a different one reusing the key.
            same = {name: value for name, value in {**payload, **kwargs}.items() if name != "attempt"}
            return _json(services.world_call(operation=operation, key=key, payload=same, perform=perform))

        return wrapped

    return decorate


def _field(data: Any, name: str, kind: type | tuple[type, ...] = str, *, required: bool = True) -> Any:
    value = data.get(name) if isinstance(data, dict) else None
    if value is None:
        if required:
            raise BadRequest(f"{name} is required.", field=name)
        return None
    # bool is an int in Python; an amount of `true` cents is a bug in the caller, not 1 cent.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise BadRequest(f"{name} has the wrong type.", field=name)
    return value


# The tenant whose agent calls (demo.agents.TENANT_HEADER): what the call creates is filed under it.
_TENANT = re.compile(r"[-a-zA-Z0-9_]{1,64}")


def _tenant(request: HttpRequest) -> str:
    tenant = request.headers.get("X-Demo-Tenant", "")
    if tenant and not _TENANT.fullmatch(tenant):
        raise BadRequest("X-Demo-Tenant must be a tenant's slug.", field="X-Demo-Tenant")
    return tenant


def _webhook_args(payload: dict[str, Any]) -> dict[str, Any]:
    args = payload.get("args")
    return args if isinstance(args, dict) else {}


def _target_email(payload: dict[str, Any]) -> str:
    """The person a compensation of an HR or workspace action undoes: the args' ``email``, else the
    action's target id (both of those tools' targets are ``("user", email)``)."""
    email = _webhook_args(payload).get("email") or payload.get("target_id")
    if not isinstance(email, str) or not email:
        raise BadRequest("args.email (or target_id) is required.", field="args.email")
    return email


def _after_snapshot(payload: dict[str, Any]) -> dict[str, Any]:
    after = payload.get("after_snapshot")
    return after if isinstance(after, dict) else {}


def _text_arg(payload: dict[str, Any], name: str, *, default: str) -> str:
    """An optional text of the compensation's args: ``default`` when it is missing or not a text."""
    value = _webhook_args(payload).get(name)
    return value if isinstance(value, str) else default


def _made_id(payload: dict[str, Any], name: str, kind: type) -> Any:
    """An id the world made when the action ran (a payment's, a sent message's): the compensation's
    args' ``name``, else the after snapshot's, since the agent cannot know it when it records the
    action. Required, of type ``kind`` (a text id not empty)."""
    value = _webhook_args(payload).get(name) or _after_snapshot(payload).get(name)
    if not isinstance(value, kind) or value == "":
        raise BadRequest(f"args.{name} (or after_snapshot.{name}) is required.", field=f"args.{name}")
    return value


# --- Forward operations (what the agents call) ------------------------------------------------


@require_POST
@world_endpoint("hr.create_user")
def hr_users(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    fields = {
        name: _field(payload, name, required=name in ("email", "name"))
        for name in ("email", "name", "department", "title", "manager", "start_date")
    }
    tenant = _tenant(request)
    return lambda: services.hr_user_create(
        **{k: v for k, v in fields.items() if v is not None}, tenant=tenant
    )


@require_POST
@world_endpoint("hr.update_title")
def hr_user_title(request: HttpRequest, payload: dict[str, Any], email: str) -> Handler:
    """hr.update_title: a person's new job title (``{"title": …}``); the answer is the record."""
    title = _field(payload, "title")
    return lambda: services.hr_user_update_title(email=email, title=title)


@require_POST
@world_endpoint("workspace.provision_license")
def workspace_licenses(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    email, sku, tenant = _field(payload, "email"), _field(payload, "sku"), _tenant(request)
    return lambda: services.license_provision(email=email, sku=sku, tenant=tenant)


@require_POST
@world_endpoint("email.send")
def email_messages(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    to, subject, body = _field(payload, "to"), _field(payload, "subject"), _field(payload, "body")
    tenant = _tenant(request)
    return lambda: services.email_send(to=to, subject=subject, body=body, tenant=tenant)


@require_POST
@world_endpoint("email.create_draft")
def email_drafts(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    to, subject, body = _field(payload, "to"), _field(payload, "subject"), _field(payload, "body")
    tenant = _tenant(request)
    return lambda: services.email_draft_create(to=to, subject=subject, body=body, tenant=tenant)


@require_http_methods(["GET", "POST"])
@world_endpoint("crm.update_ticket")
def crm_ticket(request: HttpRequest, payload: dict[str, Any], ticket_id: str) -> Handler:
    if request.method == "GET":
        return lambda: services.ticket_read(ticket_id=ticket_id)
    changes = _field(payload, "changes", dict)
    by = _field(payload, "by", required=False) or "agent"
    return lambda: services.ticket_update(ticket_id=ticket_id, changes=changes, by=by)


@require_http_methods(["GET", "POST"])
@world_endpoint("crm.update_contact")
def crm_contact(request: HttpRequest, payload: dict[str, Any], contact_id: str) -> Handler:
    if request.method == "GET":
        return lambda: services.contact_read(contact_id=contact_id)
    changes = _field(payload, "changes", dict)
    return lambda: services.contact_update(contact_id=contact_id, changes=changes)


@require_POST
@world_endpoint("payments.charge")
def payments_charges(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    customer, amount = _field(payload, "customer"), _field(payload, "amount_cents", int)
    currency = _field(payload, "currency", required=False) or "USD"
    description = _field(payload, "description", required=False) or ""
    tenant = _tenant(request)
    return lambda: services.payment_charge(
        customer=customer, amount_cents=amount, currency=currency, description=description, tenant=tenant
    )


@require_POST
@world_endpoint("payments.refund")
def payments_refunds(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    payment_id = _field(payload, "payment_id")
    amount = _field(payload, "amount_cents", int, required=False)
    reason = _field(payload, "reason", required=False) or ""
    return lambda: services.payment_refund(payment_id=payment_id, amount_cents=amount, reason=reason)


# --- Compensating endpoints (what Saga Admin's webhook compensators call) ---------------------


@require_GET
@world_endpoint("hr.read_user")
def hr_user(request: HttpRequest, payload: dict[str, Any], email: str) -> Handler:
    """An HR record's state, for a compensator check's --state-url."""
    return lambda: services.hr_user_read(email=email)


@require_POST
@world_endpoint("hr.delete_user")
def saga_delete_user(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    email = _target_email(payload)
    return lambda: services.hr_user_delete(email=email, after_snapshot=payload.get("after_snapshot"))


@require_POST
@world_endpoint("workspace.cancel_license")
def saga_cancel_license(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    email = _target_email(payload)
    return lambda: services.license_cancel(email=email, after_snapshot=payload.get("after_snapshot"))


@require_POST
@world_endpoint("email.send_correction")
def saga_send_correction(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    message_id = _made_id(payload, "message_id", int)
    # No body (or not a string): the world writes its standard correction text.
    body = _text_arg(payload, "body", default="")
    return lambda: services.email_send_correction(message_id=message_id, body=body)


@require_POST
@world_endpoint("crm.restore_ticket")
def saga_restore_ticket(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    ticket_id = payload.get("target_id") or _webhook_args(payload).get("ticket_id")
    if not isinstance(ticket_id, str) or not ticket_id:
        raise BadRequest("target_id is required.", field="target_id")
    return lambda: services.ticket_restore(
        ticket_id=ticket_id,
        before_snapshot=payload.get("before_snapshot"),
        after_snapshot=payload.get("after_snapshot"),
    )


@require_POST
@world_endpoint("payments.refund_charge")
def saga_refund(request: HttpRequest, payload: dict[str, Any]) -> Handler:
    payment_id = _made_id(payload, "payment_id", str)
    reason = _text_arg(payload, "reason", default="saga compensation")
    return lambda: services.payment_refund(payment_id=payment_id, reason=reason)


# --- A look inside the world (for people) ------------------------------------------------------


@require_GET
@login_required
def overview(request: HttpRequest) -> HttpResponse:
    """What the pretend systems hold right now, to watch a compensation put them back: the rows
    of the signed-in person's tenants only (their memberships), as on every other page."""
    tenants = [t.slug for t in tenants_for(request.user)]
    mine = {"tenant_slug__in": tenants}
    context = {
        "hr_users": HrUser.objects.filter(**mine).order_by("-created_at")[:50],
        "licenses": WorkspaceLicense.objects.filter(**mine).order_by("-created_at")[:50],
        "emails": OutboxEmail.objects.filter(**mine).select_related("corrects")[:50],
        "tickets": CrmTicket.objects.filter(**mine).order_by("id")[:50],
        "contacts": CrmContact.objects.filter(**mine).order_by("id")[:50],
        "payments": Payment.objects.filter(**mine).prefetch_related("refunds")[:50],
    }
    return render(request, "demo/overview.html", context)
