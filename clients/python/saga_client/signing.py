"""Webhook signatures, shared by the sender (Saga Admin's compensator and resume webhooks) and by
receivers (your services). Pure Python: no Django needed to verify a request.

    X-Saga-Timestamp: <unix seconds>
    X-Saga-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>

Commands pushed to an agent's ``resume_url`` are signed with its tenant's own secret,
``derive_secret(SAGA_RESUME_WEBHOOK_SECRET, "resume:" + tenant slug)`` (``manage.py resume_secret
--tenant SLUG`` prints it), so one tenant's secret verifies no other tenant's commands.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

SIGNATURE_HEADER = "X-Saga-Signature"
TIMESTAMP_HEADER = "X-Saga-Timestamp"
DEFAULT_TOLERANCE_S = 300


def compute_signature(secret: str, timestamp: str | int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def derive_secret(master: str, context: str) -> str:
    """A secret of its own for ``context`` (e.g. ``"resume:acme"``): hex HMAC-SHA256(master,
    context). Knowing one derived secret tells nothing about the master or any other context's."""
    return hmac.new(master.encode(), context.encode(), hashlib.sha256).hexdigest()


def signed_headers(secret: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: compute_signature(secret, ts, body)}


def verify_signature(
    secret: str,
    headers: Mapping[str, str],
    raw_body: bytes | str,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    *,
    now: float | None = None,
) -> bool:
    """True when the request was signed with ``secret`` within ``tolerance_s`` seconds of now
    (either way: a replay of an old request, or a timestamp from the future, is refused).

    ``headers``: any mapping of the request's headers (``X-Saga-Timestamp``, ``X-Saga-Signature``)
    whatever the case of their names — Django's ``request.headers``, a plain dict, httpx's or
    Starlette's headers. ``raw_body``: the exact bytes received, before any JSON parsing (a ``str``
    is taken as UTF-8). The signature is compared in constant time."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    timestamp = str(lowered.get(TIMESTAMP_HEADER.lower(), "")).strip()
    signature = str(lowered.get(SIGNATURE_HEADER.lower(), "")).strip()
    if not (timestamp.isascii() and timestamp.isdigit()) or not signature:
        return False
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > tolerance_s:
        return False
    body = raw_body.encode() if isinstance(raw_body, str) else bytes(raw_body)
    return hmac.compare_digest(compute_signature(secret, timestamp, body).encode(), signature.encode())
