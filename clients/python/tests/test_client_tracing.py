"""The caller's trace context on the client's requests: OpenTelemetry's current span when one is
active, a context set with ``trace_context`` (what saga-mcp does) before it, and nothing
otherwise; both clients alike, since they share the flows."""

from __future__ import annotations

import asyncio

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import format_span_id, format_trace_id
from scripted import Script

from saga_client import AsyncSaga, Saga, trace_context

RUN = {"id": "run_1", "status": "running"}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# The agent's own SDK, used without being installed globally: the client reads the current context.
TRACER = TracerProvider().get_tracer("agent")


def _sent(*, async_client: bool = False) -> httpx.Request:
    script = Script((201, RUN))
    if async_client:

        async def go() -> None:
            async with AsyncSaga(
                "http://saga.test", "sk_a_b", transport=httpx.MockTransport(script.handle)
            ) as saga:
                await saga.create_run(agent="a", request="r")

        asyncio.run(go())
    else:
        Saga("http://saga.test", "sk_a_b", transport=script.transport).create_run(agent="a", request="r")
    return script.seen[0]


def test_no_span_and_no_context_send_no_traceparent():
    assert "traceparent" not in _sent().headers
    assert "traceparent" not in _sent(async_client=True).headers


def test_the_current_span_is_sent_as_a_w3c_traceparent_by_both_clients():
    for async_client in (False, True):
        with TRACER.start_as_current_span("agent step") as span:
            sent = _sent(async_client=async_client)
        context = span.get_span_context()
        assert sent.headers["traceparent"] == (
            f"00-{format_trace_id(context.trace_id)}-{format_span_id(context.span_id)}-{context.trace_flags:02x}"
        )


def test_an_explicit_context_wins_and_a_malformed_one_is_ignored():
    with TRACER.start_as_current_span("agent step"), trace_context(TRACEPARENT, "vendor=abc"):
        sent = _sent()
    assert sent.headers["traceparent"] == TRACEPARENT
    assert sent.headers["tracestate"] == "vendor=abc"
    for bad in ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", "not-a-traceparent", "ff" + TRACEPARENT[2:], None):
        with trace_context(bad):
            assert "traceparent" not in _sent().headers
