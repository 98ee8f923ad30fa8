"""The ``Idempotency-Key`` header (draft-ietf-httpapi-idempotency-key-header, Stripe's behaviour).

Same key + same request → the original response, replayed with ``Idempotent-Replayed: true``;
same key + another request → 422 ``idempotency_key_reused``; same key while the first request is
still running → 409 ``idempotency_key_in_flight``. Keys are per tenant and kept at least 24 h
(``ledger.services.idempotency`` prunes older records).

The record is claimed, the operation runs and the response is stored in ONE transaction. So the
record and what the request created commit together or not at all: a crash in between leaves
neither, and the client's retry simply runs again. A concurrent duplicate's INSERT waits on the
first one's uncommitted row (PostgreSQL's unique index does the queueing); it then replays the
committed response, or gives up with 409 after ``IN_FLIGHT_WAIT_MS``. Only successes are stored:
an error changed nothing, so retrying with the same key must be allowed to try again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse

from infra import errors
from infra.hashing import canonical_json_bytes
from infra.lock_waits import in_flight_on_lock_timeout
from ledger.models import IdempotencyRecord, Tenant
from saga_admin.api.limits import parsed_body
from saga_admin.api.renderers import render_json

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
# Visible ASCII only: keys end up in logs, URLs of dashboards and database indexes.
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"
_KEY_RE = re.compile(KEY_PATTERN)
# How long a duplicate waits for the first request before answering 409 in flight.
IN_FLIGHT_WAIT_MS = 2000

Produce = Callable[[], tuple[int, Any]]


def validate_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise errors.ValidationFailed(
            "Idempotency-Key must be 1 to 255 visible ASCII characters.", details={"header": HEADER}
        )
    return key


def request_fingerprint(request: HttpRequest) -> str:
    """What makes two requests "the same": method, path, the body's JSON value (so key order and
    whitespace do not matter) and who sent it — the authenticated key's agent name, so one agent
    reusing another's key of the same tenant is refused (422) instead of handed the other agent's
    stored response (e.g. its new run)."""
    body = parsed_body(request)
    agent = getattr(getattr(request, "auth", None), "name", "")
    # The canonical bytes as ``sha256_hex`` spells them (stored fingerprints still match), made by
    # orjson: a megabyte of body costs a few milliseconds here, not tens.
    fingerprint = {"method": request.method, "path": request.path, "body": body, "agent": agent}
    return hashlib.sha256(canonical_json_bytes(fingerprint)).hexdigest()


def json_response(status: int, body: Any, *, replayed: bool = False) -> HttpResponse:
    # Rendered as every other API response is (orjson): a megabyte of args echoed back is encoded
    # in a few milliseconds, not the standard library's tens.
    response = HttpResponse(render_json(body), status=status, content_type="application/json")
    if replayed:
        response[REPLAYED_HEADER] = "true"
    return response


def idempotent_response(
    request: HttpRequest, *, tenant: Tenant, key: str | None, produce: Produce
) -> HttpResponse:
    """Run ``produce`` (which returns a 2xx status and a JSON-ready body, or raises) at most once
    per (tenant, key)."""
    if key is None:
        status, body = produce()
        return json_response(status, body)
    validate_key(key)
    fingerprint = request_fingerprint(request)
    refusal: errors.SagaError | None = None
    with transaction.atomic():
        replay = _claim(request, tenant=tenant, key=key, fingerprint=fingerprint)
        if replay is not None:
            return replay
        try:
            status, body = produce()
        except errors.SagaError as exc:
            # Only successes are stored: the key is released for a corrected retry. What the refusal
            # left behind stays, exactly as without a key: the services roll their own work back
            # (each runs in its own transaction) and then audit the refusal, and that event must
            # not roll back with the claim.
            IdempotencyRecord.objects.filter(tenant=tenant, key=key).delete()
            refusal = exc
        else:
            IdempotencyRecord.objects.filter(tenant=tenant, key=key).update(
                state=IdempotencyRecord.State.COMPLETED, response_status=status, response_body=body
            )
    if refusal is not None:
        raise refusal
    return json_response(status, body)


# The claim in one round trip: the wait for another request's uncommitted record of the same key
# is bounded (``lock_timeout``, set for this statement's own row before it is inserted), the key
# taken unless it exists (no exception, so no savepoint), and the bound lifted again for the rest of
# the transaction (the operation's own lock waits are not cut short) in RETURNING. A key taken
# already returns no row: the committed record is then read. Before, the same took six round trips
# (SET LOCAL, SAVEPOINT, INSERT, RELEASE, SET LOCAL … TO DEFAULT), a third of a governed call's.
_CLAIM = f"""
INSERT INTO {IdempotencyRecord._meta.db_table}
    (tenant_id, key, method, path, request_hash, state, created_at)
SELECT %s, %s, %s, %s, %s, %s, now()
FROM (SELECT set_config('lock_timeout', %s, true) AS bound) AS waiting
WHERE waiting.bound IS NOT NULL
ON CONFLICT (tenant_id, key) DO NOTHING
RETURNING set_config('lock_timeout', (SELECT reset_val FROM pg_settings WHERE name = 'lock_timeout'), true)
"""  # noqa: S608 - the table is the model's; every value is a parameter


def _claim(request: HttpRequest, *, tenant: Tenant, key: str, fingerprint: str) -> HttpResponse | None:
    """Insert the key's record (None: we own it) or answer from the existing one."""
    params: list[str | int] = [
        tenant.pk,
        key,
        request.method or "",
        request.path[:500],
        fingerprint,
        IdempotencyRecord.State.IN_FLIGHT,
        f"{int(IN_FLIGHT_WAIT_MS)}ms",
    ]
    with (
        in_flight_on_lock_timeout(
            "A request with this Idempotency-Key is still being processed; retry shortly.",
            details={"idempotency_key": key},
        ),
        connection.cursor() as cursor,
    ):
        cursor.execute(_CLAIM, params)
        if cursor.fetchone() is not None:
            return None
    existing = IdempotencyRecord.objects.get(tenant=tenant, key=key)
    if existing.request_hash != fingerprint:
        raise errors.IdempotencyKeyReused(
            "This Idempotency-Key was already used for a different request.",
            details={"idempotency_key": key, "method": existing.method, "path": existing.path},
        )
    return json_response(existing.response_status or 200, existing.response_body, replayed=True)
