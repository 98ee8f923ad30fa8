"""Webhook signatures as the server sends (and the demo world checks) them: the server's own
implementation of the algorithm ``clients/spec/vectors/signatures.json`` specifies, so the server
distribution needs nothing of the client's (``saga_client.signing`` implements the same for
receivers; tests/client/test_signature_vectors.py runs both over every vector).

    X-Saga-Timestamp: <unix seconds>
    X-Saga-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>

A resume command's body names its destination (``"url"``); ``verify_signature(..., url=...)``
refuses one signed for another URL (scheme and host without regard to case, a default port the
same as none, the fragment ignored, path and query exactly).
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
_DEFAULT_PORTS = {"http": 80, "https": 443}


def compute_signature(secret: str, timestamp: str | int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def derive_secret(master: str, context: str) -> str:
    """Hex HMAC-SHA256(master, context): a secret of its own for ``context``."""
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
    """True when ``raw_body`` was signed with ``secret`` within ``tolerance_s`` seconds of now
    (either way) and, when ``url`` is given, the body is a JSON object whose ``"url"`` names it.
    Header names in any case; the signature compared in constant time."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    timestamp = str(lowered.get(TIMESTAMP_HEADER.lower(), "")).strip()
    signature = str(lowered.get(SIGNATURE_HEADER.lower(), "")).strip()
    # Unix seconds have 10 digits for centuries yet; a longer one (unauthenticated input) would make
    # int() raise past 4,300 digits and the float subtraction overflow past 308: refused, not raised.
    if not (timestamp.isascii() and timestamp.isdigit()) or len(timestamp) > MAX_TIMESTAMP_DIGITS:
        return False
    if not signature:
        return False
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance_s:
        return False
    body = raw_body.encode() if isinstance(raw_body, str) else bytes(raw_body)
    if not hmac.compare_digest(compute_signature(secret, timestamp, body).encode(), signature.encode()):
        return False
    return url is None or _names_destination(body, url)


def _names_destination(body: bytes, url: str) -> bool:
    try:
        payload = json.loads(body)
    except ValueError:
        return False
    named = payload.get("url") if isinstance(payload, dict) else None
    if not isinstance(named, str):
        return False
    expected = _destination(url)
    return expected is not None and expected == _destination(named)


def _destination(url: str) -> tuple[str, str, int | None, bytes] | None:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    if parsed.scheme not in _DEFAULT_PORTS or not parsed.raw_host:
        return None
    host = parsed.raw_host.decode("ascii").lower().rstrip(".")
    port = None if parsed.port == _DEFAULT_PORTS[parsed.scheme] else parsed.port
    return parsed.scheme, host, port, parsed.raw_path
