"""OpenTelemetry traces: set up in one place, for the web and the worker processes (here, below
both: ``saga_admin.wsgi`` and the ``saga_worker`` command call it).

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; then
``telemetry_start`` (called by ``saga_admin.wsgi`` before the application loads, and by the
``saga_worker`` command) exports spans over OTLP/HTTP (protobuf) with the SDK's batch processor,
instruments Django (an incoming ``traceparent`` joins the caller's trace), psycopg, redis and httpx
(an outgoing request, a compensator's webhook among them, carries ``traceparent`` on), and switches
on the ledger's own spans (``infra.tracing``). With the variable unset, this module imports no
OpenTelemetry at all.

URLs in spans are scheme, host and route only (``url_hooks``): an outgoing request's URL is often
its credential (a Slack incoming webhook's path, a compensator's or an agent's ``resume_url`` with
a token in its path or query, Slack's ``response_url``), and an incoming one may carry one in its
query (the OIDC callback's ``code`` and ``state``). A trace backend is read by more people than the
ledger, so neither the instrumentations' ``http.url``/``url.full`` nor ``http.target``,
``url.path`` and ``url.query`` leave the process as sent.

The exporter reads the standard variables itself: ``OTEL_EXPORTER_OTLP_*`` endpoint, headers,
compression (``none``, ``gzip``), timeout and certificates; ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the process; ``OTEL_TRACES_SAMPLER`` picks the sampler.

Forks: the SDK's batch processor starts its export thread again in a forked child (it registers
``os.register_at_fork``), so gunicorn workers (forked after the WSGI module is imported, or with
``--preload`` before) and RQ's work horses export from their own thread. A work horse leaves with
``os._exit``, which runs no exit handler: the worker flushes after each job (``telemetry_flush``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from infra import tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SUPPORTED_PROTOCOL = "http/protobuf"

_provider: TracerProvider | None = None


def traces_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process should export traces: an OTLP endpoint is set and the SDK is not
    switched off (``OTEL_SDK_DISABLED=true``)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def check_protocol(environ: Mapping[str, str] = os.environ) -> None:
    """Refuse an OTLP protocol this installation cannot speak, rather than send nothing quietly."""
    for name in PROTOCOL_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            if value != SUPPORTED_PROTOCOL:
                raise ImproperlyConfigured(
                    f"{name}={value} is not supported: Saga Admin exports traces over OTLP/HTTP "
                    f"({SUPPORTED_PROTOCOL}). Unset it or set it to {SUPPORTED_PROTOCOL}."
                )
            return  # the traces-specific variable wins over the general one


def telemetry_start(*, service: str, django: bool = False) -> bool:
    """Set up traces for this process, once; False (and nothing imported) when they are off.

    ``service``: the default ``service.name`` (``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES``
    win). ``django``: instrument Django's request handling too (the web process; before the WSGI
    application is built, so its middleware is in place)."""
    global _provider  # noqa: PLW0603 - one provider per process, set at start-up
    if _provider is not None:
        return True
    if not traces_configured():
        return False
    check_protocol()
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource, sampler=_default_sampler())
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider = provider
    if django:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        DjangoInstrumentor().instrument(
            tracer_provider=provider, request_hook=_server_request_hook, response_hook=_server_response_hook
        )
    # Statements without their parameters (the instrumentation's default): a tool call's args
    # never leave for the trace backend.
    PsycopgInstrumentor().instrument(tracer_provider=provider, skip_dep_check=True)
    RedisInstrumentor().instrument(tracer_provider=provider)
    HTTPXClientInstrumentor().instrument(tracer_provider=provider, request_hook=_client_request_hook)
    tracing.switch_on()
    return True


# How long a work horse waits, after each job, for its spans to leave. Short: a collector that is
# slow or down must not add seconds to every unwind step and periodic job (what is not exported by
# then is dropped, as the batch processor drops a full queue).
FLUSH_AFTER_JOB_MS = 500


def telemetry_flush(timeout_ms: int = FLUSH_AFTER_JOB_MS) -> None:
    """Export what this process has buffered (a work horse before it exits), waiting at most
    ``timeout_ms``."""
    if _provider is not None:
        _provider.force_flush(timeout_ms)


def telemetry_provider() -> TracerProvider | None:
    """The provider this process set up, or None when traces are off."""
    return _provider


# --- URLs in spans: scheme, host and route only ------------------------------------------------

REDACTED = "[redacted]"
_URL_KEYS = ("http.url", "url.full")  # the old and the new semantic conventions' names
_PATH_KEYS = ("http.target", "url.path")
_QUERY_KEYS = ("url.query",)


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of a URL, without user info, path, query or fragment; empty
    when it is not an absolute URL."""
    # Never raises: httpx calls its request hook unguarded, so an error here would fail the request.
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return ""
    if not parts.scheme or not host:
        return ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


def span_urls_scrubbed(span: Any, *, route: str | None) -> None:
    """Overwrite the URL attributes the HTTP instrumentations set on ``span``: the full URL to its
    origin (plus ``route``, the matched route template, when there is one), the target and path to
    the route (or ``[redacted]``), the query to ``[redacted]``. Only attributes the span has are
    touched, so the semantic-convention mode in force stays as it is."""
    if not span.is_recording():
        return
    present = dict(getattr(span, "attributes", None) or {})
    path = f"/{route.lstrip('/')}" if route else REDACTED
    for key in _URL_KEYS:
        if key in present:
            origin = origin_of(str(present[key])) or REDACTED
            span.set_attribute(key, origin + path if route else origin)
    for key in _PATH_KEYS:
        if key in present:
            span.set_attribute(key, path)
    for key in _QUERY_KEYS:
        if key in present:
            span.set_attribute(key, REDACTED)


def _client_request_hook(span: Any, _request: Any) -> None:
    """httpx: an outgoing request's span keeps the scheme and host it went to, no path: there is
    no route to name, and the path may be the secret."""
    span_urls_scrubbed(span, route=None)


def _server_request_hook(span: Any, _request: Any) -> None:
    """Django, as the request starts (its route is not resolved yet): nothing of the path or
    query stays, even if the response hook never runs."""
    span_urls_scrubbed(span, route=None)


def _server_response_hook(span: Any, request: Any, _response: Any) -> None:
    """Django, once answered: the route template (``api/v1/runs/<str:run_id>``), never the path."""
    match = getattr(request, "resolver_match", None)
    span_urls_scrubbed(span, route=getattr(match, "route", None) or None)


def _default_sampler() -> Any:
    """The SDK's sampler from ``OTEL_TRACES_SAMPLER`` when it is set; otherwise every trace, but
    no trace made of a lone database or Redis call: the worker's polling and periodic duties
    would otherwise each start a trace of one span, many a second, and bury the unwinds."""
    if os.environ.get("OTEL_TRACES_SAMPLER", "").strip():
        return None  # TracerProvider reads the variable
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision, ParentBased, Sampler, SamplingResult
    from opentelemetry.trace import SpanKind

    class NoLoneClientCalls(Sampler):
        def should_sample(
            self,
            parent_context: Any,
            trace_id: int,
            name: str,
            kind: SpanKind | None = None,
            attributes: Any = None,
            links: Sequence[Any] | None = None,
            trace_state: Any = None,
        ) -> SamplingResult:
            if kind is SpanKind.CLIENT:
                return SamplingResult(Decision.DROP)
            return ALWAYS_ON.should_sample(
                parent_context, trace_id, name, kind, attributes, links, trace_state
            )

        def get_description(self) -> str:
            return "NoLoneClientCalls"

    return ParentBased(root=NoLoneClientCalls())
