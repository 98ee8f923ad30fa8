"""The spans the ledger and the unwind engine make, when traces are on.

``infra.telemetry`` switches traces on at a process's start-up (only when an OTLP endpoint is
configured) by calling ``switch_on``. Until then nothing here imports OpenTelemetry and each
helper costs one look at a module global: the ledger's hot path pays nothing for traces it does
not send.

Spans carry ids and names only, never a tool call's args, result or any secret: a trace backend
is read by more people than the ledger.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

P = ParamSpec("P")
R = TypeVar("R")

# The GenAI semantic conventions' names for a tool execution (gen_ai.* attributes, "execute_tool"
# operation); the saga.* ones are this project's own.
EXECUTE_TOOL = "execute_tool"

_tracer: Tracer | None = None


def switch_on() -> None:
    """Called once per process by ``infra.telemetry`` after its tracer provider is set."""
    global _tracer  # noqa: PLW0603 - the one switch, set at start-up
    from opentelemetry import trace

    _tracer = trace.get_tracer("saga_admin.ledger")


def is_on() -> bool:
    return _tracer is not None


# --- A recorded tool call ----------------------------------------------------------------------


def traced_tool_call(record: Callable[P, R]) -> Callable[P, R]:
    """Wrap ``action_record`` (keyword-only: ``run``, ``tool``) in an ``execute_tool <tool>`` span
    when traces are on. The span is a child of whatever is current: the API request's span, which
    joined the agent's trace when the agent sent a ``traceparent``."""

    @functools.wraps(record)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if _tracer is None:
            return record(*args, **kwargs)
        return _record_in_span(_tracer, record, args, kwargs)

    return wrapper


def _record_in_span(tracer: Tracer, record: Callable[..., R], args: Any, kwargs: dict[str, Any]) -> R:
    from opentelemetry.trace import SpanKind, Status, StatusCode

    tool = str(kwargs.get("tool") or "")
    run = kwargs.get("run")
    attributes: dict[str, str] = {"gen_ai.operation.name": EXECUTE_TOOL, "gen_ai.tool.name": tool}
    if run is not None:
        attributes["saga.run.id"] = str(run.pk)
        attributes["saga.tenant"] = _tenant_label(run)
    with tracer.start_as_current_span(
        f"{EXECUTE_TOOL} {tool}", kind=SpanKind.INTERNAL, attributes=attributes, record_exception=False
    ) as span:
        try:
            recorded = record(*args, **kwargs)
        except Exception as exc:
            # A refusal (paused, denied, a reused key) is the call's outcome, named by its code; its
            # message may quote the caller's input, so it stays out of the span.
            span.set_attribute("error.type", str(getattr(exc, "code", "") or type(exc).__qualname__))
            span.set_status(Status(StatusCode.ERROR))
            raise
        action = getattr(recorded, "action", None)
        if action is not None:
            span.set_attribute("saga.action.id", str(action.pk))
            span.set_attribute("gen_ai.tool.call.id", str(action.pk))
            span.set_attribute("saga.action.status", str(action.status))
        span.set_attribute("saga.action.replayed", not getattr(recorded, "created", True))
        return recorded


def _tenant_label(run: Any) -> str:
    """The tenant's slug when the run carries its tenant (the API's references do), else its id:
    never a query for a label."""
    state = getattr(run, "_state", None)
    cached = getattr(state, "fields_cache", {}) if state is not None else {}
    tenant = cached.get("tenant")
    return str(tenant.slug) if tenant is not None else str(run.tenant_id)


# --- Carrying a trace across processes (the unwind's jobs) -------------------------------------


def carrier_of_current() -> dict[str, str]:
    """The current trace context as W3C headers (``traceparent``, maybe ``tracestate``); empty
    when traces are off or nothing is being traced."""
    if _tracer is None:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def unwind_span_started(*, unwind_id: str, run: Any, automatic: bool) -> dict[str, str]:
    """The root of an unwind's trace: a short span for the decision (a child of the request or job
    that made it), whose context every step span of the unwind then hangs from, whichever job and
    process carries the step. Returns the context to keep with the unwind; empty when traces are
    off."""
    if _tracer is None:
        return {}
    with _tracer.start_as_current_span(
        f"unwind {run.pk}",
        attributes={
            "saga.unwind.id": unwind_id,
            "saga.run.id": str(run.pk),
            "saga.tenant": _tenant_label(run),
            "saga.unwind.automatic": automatic,
        },
    ):
        return carrier_of_current()


def unwind_step_span(
    carrier: Mapping[str, str] | None, *, name: str, attributes: Mapping[str, str | int | bool]
) -> AbstractContextManager[Span | None]:
    """A span for one unwind step a worker carries out, a child of the unwind's root span (its
    ``carrier``, kept with the unwind). The compensator's HTTP call made inside it carries its
    ``traceparent`` on (the httpx instrumentation injects it)."""
    if _tracer is None:
        return nullcontext()
    return _step_span(_tracer, carrier or {}, name, attributes)


@contextmanager
def _step_span(
    tracer: Tracer, carrier: Mapping[str, str], name: str, attributes: Mapping[str, str | int | bool]
) -> Iterator[Span]:
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(dict(carrier))
    # Ids and names only, as every span of the ledger's: an exception's message and traceback
    # (a database error quoting a row) stay out of the trace backend; step_outcome marks the error.
    with tracer.start_as_current_span(
        name, context=parent, kind=SpanKind.INTERNAL, attributes=dict(attributes), record_exception=False
    ) as span:
        yield span


def step_outcome(span: Span | None, *, outcome: str, error: bool) -> None:
    """Mark a step span with its outcome (``done``, ``retry``, ``failed``, ``drifted``)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("saga.step.outcome", outcome)
    if error:
        span.set_status(Status(StatusCode.ERROR))
