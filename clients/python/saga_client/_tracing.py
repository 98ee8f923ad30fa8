"""The caller's trace context on every request: a W3C ``traceparent`` (and its ``tracestate``), so
that Saga Admin's spans for the call (``execute_tool <tool>``) join the agent's trace.

Two sources, the first that has one: a context the caller set with ``trace_context`` (saga-mcp
passes on the one its own caller sent), else OpenTelemetry's current span when the
``opentelemetry-api`` package is installed and a span is active. The client never requires
OpenTelemetry: without it, and without an explicit context, no header is sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

try:  # optional: the client works the same without OpenTelemetry
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _propagator: Any = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised where opentelemetry is not installed
    _propagator = None

# W3C Trace Context, version 00 (and future versions read as 00 by their first four fields).
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$")
_TRACESTATE_MAX = 512

_explicit: ContextVar[Mapping[str, str] | None] = ContextVar("saga_client_trace_context", default=None)


def valid_traceparent(value: Any) -> bool:
    return isinstance(value, str) and value[:2] != "ff" and bool(_TRACEPARENT.match(value))


def trace_headers() -> dict[str, str]:
    """The headers that carry the caller's trace context, or none."""
    explicit = _explicit.get()
    if explicit is not None:
        return dict(explicit)
    if _propagator is None:
        return {}
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)  # nothing when no valid span is current
    return carrier


@contextmanager
def trace_context(traceparent: str | None, tracestate: str | None = None) -> Iterator[None]:
    """Send this ``traceparent`` (W3C) with every request made inside the block, instead of
    OpenTelemetry's current span. A malformed value is ignored: the block runs as without it."""
    if not valid_traceparent(traceparent):
        yield
        return
    headers = {"traceparent": str(traceparent)}
    if tracestate and len(tracestate) <= _TRACESTATE_MAX and tracestate.isprintable():
        headers["tracestate"] = tracestate
    token = _explicit.set(headers)
    try:
        yield
    finally:
        _explicit.reset(token)
