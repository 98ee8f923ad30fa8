"""Structured JSON logs: one line per event, with the request id, tenant and run bound by the
middleware and the services (structlog contextvars)."""

from __future__ import annotations

import logging

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

_SECRET_KEYS = {"authorization", "api_key", "key", "secret", "password", "token", "x-saga-signature"}


def _redact(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """Never let a secret reach a log line, whoever passed it."""
    for field in list(event_dict):
        if field.lower() in _SECRET_KEYS:
            event_dict[field] = "[redacted]"
    return event_dict


_SHARED: list[Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    _redact,
]


def json_formatter() -> logging.Formatter:
    # JSONRenderer escapes control characters, so a client-supplied string cannot forge a
    # second log line (log injection).
    return structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
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
