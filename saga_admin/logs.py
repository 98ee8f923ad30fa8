"""Structured JSON logs: one line per event, with the request id, tenant and run bound by the
middleware and the services (structlog contextvars).

No secret reaches a line, whoever logs it: the last step before rendering redacts fields named like
secrets, and inside every string (messages of other libraries' loggers, exception text included)
API keys, bearer tokens and passwords in URLs."""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote_plus

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

REDACTED = "[redacted]"

# Fields whose whole value is a secret: these names exactly, or names containing one of the parts.
# (Not "key": the API binds the key's public prefix under that name, and a whole key is caught by
# its pattern below wherever it appears.)
_SECRET_FIELDS = {"api_key", "apikey", "authorization", "cookie", "set-cookie", "x-saga-signature"}
_SECRET_FIELD_PARTS = ("secret", "password", "passwd", "token", "signature", "credential", "sessionid")

# Secrets inside free text. An API key keeps its public prefix (sk_<id>), which names the key
# without letting anyone use it; a wrong key a client sent is redacted just the same.
_SECRET_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(sk_[A-Za-z0-9]{1,40})_[A-Za-z0-9_\-]+"), rf"\1_{REDACTED}"),
    (re.compile(r"\b(Bearer)\s+[A-Za-z0-9._~+/=\-]+", re.IGNORECASE), rf"\1 {REDACTED}"),
    (re.compile(r"\b(Basic)\s+[A-Za-z0-9+/]{8,}={0,2}"), rf"\1 {REDACTED}"),
    (re.compile(r"\b([a-z][a-z0-9+.\-]*://[^\s/:@]*):[^\s/@]+@", re.IGNORECASE), rf"\1:{REDACTED}@"),
    # An approval e-mail's decision link is a capability while it is unused (recovery.notifications.email_links):
    # its path is logged (the access log, "Not Found: …") without the token.
    (re.compile(r"(/approvals/email/)[^/\s?#\"']+"), rf"\1{REDACTED}"),
)


def _is_secret_field(name: str) -> bool:
    lowered = name.lower()
    return lowered in _SECRET_FIELDS or any(part in lowered for part in _SECRET_FIELD_PARTS)


def redact_text(text: str) -> str:
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


# Query parameters whose value is a credential by their name alone: OAuth's and OIDC's (the SSO
# callback's ``code`` and ``state`` among them), and any named like a secret field.
_SECRET_QUERY_PARAMETERS = {
    "code",
    "state",
    "id_token",
    "access_token",
    "refresh_token",
    "session_state",
    "client_secret",
    "code_verifier",
    "nonce",
}


def redact_query(query: str) -> str:
    """A query string with the value of every credential-named parameter replaced (the names and
    the other values kept as sent), then redacted as any text is."""
    pairs = []
    for pair in query.split("&"):
        name, equals, _value = pair.partition("=")
        plain = unquote_plus(name).strip().lower()
        if equals and (
            plain in _SECRET_QUERY_PARAMETERS or any(part in plain for part in _SECRET_FIELD_PARTS)
        ):
            pair = f"{name}={REDACTED}"
        pairs.append(pair)
    return redact_text("&".join(pairs))


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            key: REDACTED if isinstance(key, str) and _is_secret_field(key) else _redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_redact_value(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_redact_value(item) for item in value)
    return value


def redact(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """Never let a secret reach a log line, whoever passed it."""
    for field, value in list(event_dict.items()):
        event_dict[field] = REDACTED if _is_secret_field(field) else _redact_value(value)
    return event_dict


_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def json_formatter() -> logging.Formatter:
    # JSONRenderer escapes control characters, so a client-supplied string cannot forge a
    # second log line (log injection). Redaction runs last before it, after the exception text
    # exists, on structlog's events and every other library's records alike.
    return structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            redact,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        foreign_pre_chain=_SHARED,
    )


structlog.configure(
    processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=structlog.stdlib.BoundLogger,
    cache_logger_on_first_use=True,
)
