"""Webhook signatures, shared by the sender (Saga Admin's compensator and resume webhooks) and by
receivers (your services). Pure Python: no Django needed to verify a request.

    X-Saga-Timestamp: <unix seconds>
    X-Saga-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>

Commands pushed to an agent's ``resume_url`` are signed with that agent's own secret,
``derive_secret(SAGA_RESUME_WEBHOOK_SECRET, "resume:" + tenant slug + ":" + agent name)``
(``manage.py resume_secret --tenant SLUG --agent NAME`` prints it), so one agent's secret verifies
no other agent's commands. Their body names the destination (``"url"``, the run's ``resume_url``):
``verify_signature(..., url=YOUR_RESUME_URL)`` also refuses a command that was signed for another
URL, so a command captured on its way to one endpoint cannot be replayed at another.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping

import httpx

SIGNATURE_HEADER = "X-Saga-Signature"
TIMESTAMP_HEADER = "X-Saga-Timestamp"
DEFAULT_TOLERANCE_S = 300
MAX_TIMESTAMP_DIGITS = 20


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
    url: str | None = None,
) -> bool:
    """True when the request was signed with ``secret`` within ``tolerance_s`` seconds of now
    (either way: a replay of an old request, or a timestamp from the future, is refused) and, when
    ``url`` is given, its body is a JSON object whose ``"url"`` names that destination.

    ``headers``: any mapping of the request's headers (``X-Saga-Timestamp``, ``X-Saga-Signature``)
    whatever the case of their names — Django's ``request.headers``, a plain dict, httpx's or
    Starlette's headers. ``raw_body``: the exact bytes received, before any JSON parsing (a ``str``
    is taken as UTF-8). The signature is compared in constant time.

    ``url``: the URL this endpoint was registered as (a run's ``resume_url``). Commands pushed to a
    ``resume_url`` carry it in their signed body; a body naming another destination (or none) is
    refused. Scheme and host are compared without regard to case, a default port (80, 443) is the
    same as none, and the fragment is ignored; path and query must match exactly."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    timestamp = str(lowered.get(TIMESTAMP_HEADER.lower(), "")).strip()
    signature = str(lowered.get(SIGNATURE_HEADER.lower(), "")).strip()
    # Unix seconds have 10 digits for centuries yet; a longer one (unauthenticated input) would make
    # int() raise past 4,300 digits and the float subtraction overflow past 308: refused, not raised.
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > MAX_TIMESTAMP_DIGITS:
        return False
    if not signature:
        return False
    current = time.time() if now is None else now
    if abs(current - int(timestamp)) > tolerance_s:
        return False
    body = raw_body.encode() if isinstance(raw_body, str) else bytes(raw_body)
    if not hmac.compare_digest(compute_signature(secret, timestamp, body).encode(), signature.encode()):
        return False
    return url is None or _names_destination(body, url)


def _names_destination(body: bytes, url: str) -> bool:
    # Checked only after the signature: the body is the sender's, not whoever relayed it.
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    destination = payload.get("url") if isinstance(payload, dict) else None
    if not isinstance(destination, str):
        return False
    expected, named = _destination(url), _destination(destination)
    return expected is not None and expected == named


def _destination(url: str) -> tuple[str, str, int | None, bytes] | None:
    """A URL as the request it sends: scheme, host, port (None for the scheme's default) and the
    path with its query; None when it is not an absolute http(s) URL."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        return None
    host = parsed.raw_host.decode("ascii").lower().rstrip(".")
    # httpx drops a default port only for a lower-case scheme; the same request either way.
    port = None if parsed.port == {"http": 80, "https": 443}[parsed.scheme] else parsed.port
    return parsed.scheme, host, port, parsed.raw_path
