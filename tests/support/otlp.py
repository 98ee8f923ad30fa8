"""An OTLP/HTTP trace receiver for the tests: a real endpoint (``POST /v1/traces``) that decodes each
``ExportTraceServiceRequest`` (protobuf, gzip or not) with ``opentelemetry-proto`` and keeps the
spans, as a collector would see them."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.processes import http_serving


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root
    kind: int
    attributes: dict[str, Any]
    service: str
    status_code: int


@dataclass
class OtlpReceiver:
    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: list[dict[str, str]] = field(default_factory=list)  # each export's headers
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.port}"

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def ancestors(self, span: ReceivedSpan) -> list[str]:
        """The span ids above ``span`` that this receiver got, nearest first, then the first
        parent id it did not get (a span exported elsewhere, such as the client's own)."""
        with self.lock:
            by_id = {s.span_id: s for s in self.spans if s.trace_id == span.trace_id}
        chain, parent = [], span.parent_span_id
        while parent:
            chain.append(parent)
            above = by_id.get(parent)
            parent = above.parent_span_id if above is not None else ""
        return chain

    def keep(self, request: ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            service=str(resource.get("service.name", "")),
                            status_code=span.status.code,
                        )
                    )
        with self.lock:
            self.spans.extend(found)
            self.requests.append(headers)


@contextmanager
def serve_otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            encoding = (self.headers.get("Content-Encoding") or "").lower()
            if encoding == "gzip":
                raw = gzip.decompress(raw)
            elif encoding == "deflate":
                raw = zlib.decompress(raw)
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self._answer(404, b"")
                return
            request = ExportTraceServiceRequest()
            request.ParseFromString(raw)
            receiver.keep(request, {k.lower(): v for k, v in self.headers.items()})
            self._answer(200, ExportTraceServiceResponse().SerializeToString())

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            return

    with http_serving(Handler) as port:
        receiver.port = port
        yield receiver
