"""A worker's own ``/metrics``, for deployments where the worker does not share a host's metrics
directory with the web (Compose services, Kubernetes pods): its counters and histograms would
otherwise never reach a scrape.

``saga_worker`` starts it on ``SAGA_WORKER_METRICS_PORT`` when that is set: a small threaded
HTTP server in the worker's main process, answering ``GET /metrics`` with the exposition of the
files in this process's metrics directory (the worker and its work horses), behind the same
``Authorization: Bearer $SAGA_METRICS_TOKEN`` as the web's ``/metrics`` (``bearer_matches``). The
gauges read from PostgreSQL and Redis are the web's alone, so nothing is counted twice. On one host
where web and worker share the directory (``make run``, the Procfile), leave the port unset: the
web's scrape already holds the worker's values.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.multiprocess import MultiProcessCollector

from ledger import metrics

PORT_VARIABLE = "SAGA_WORKER_METRICS_PORT"

StartResponse = Callable[..., Any]


def bearer_matches(header: str, token: str) -> bool:
    """``header`` (an Authorization header's value, any text at all) is ``Bearer <token>``,
    compared in constant time. The one check of both ``/metrics`` endpoints."""
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token:
        return False
    # WSGI hands header values over as latin-1 text: encoded back, every value compares.
    return hmac.compare_digest(given.strip().encode("latin-1", "replace"), token.encode())


def port_from(raw: str) -> int | None:
    """``SAGA_WORKER_METRICS_PORT`` read: None when unset; ``ValueError`` naming it when not a port."""
    raw = raw.strip()
    if not raw:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"{PORT_VARIABLE}={raw!r} is not a TCP port (1-65535).")
    return int(raw)


def exposition() -> bytes:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics.MULTIPROCESS_DIR))  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def _plain(start_response: StartResponse, status: str, text: str, *extra: tuple[str, str]) -> list[bytes]:
    body = text.encode()
    headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), *extra]
    start_response(status, headers)
    return [body]


def app(token: str) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """The endpoint as a WSGI application: 401 without the token, 404 off ``/metrics``, 405 for
    anything but GET and HEAD."""

    def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if not bearer_matches(str(environ.get("HTTP_AUTHORIZATION", "")), token):
            return _plain(
                start_response,
                "401 Unauthorized",
                "A valid Authorization: Bearer <SAGA_METRICS_TOKEN> header is required.\n",
                ("WWW-Authenticate", 'Bearer realm="metrics"'),
            )
        if environ.get("PATH_INFO") != "/metrics":
            return _plain(start_response, "404 Not Found", "Only /metrics is served here.\n")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return _plain(start_response, "405 Method Not Allowed", "Only GET.\n", ("Allow", "GET, HEAD"))
        body = exposition()
        start_response(
            "200 OK",
            [
                ("Content-Type", CONTENT_TYPE_PLAIN_0_0_4),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [] if environ["REQUEST_METHOD"] == "HEAD" else [body]

    return application


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Scrapes every few seconds are not worth a log line each."""


def serve(*, port: int, token: str, host: str = "0.0.0.0") -> WSGIServer:  # noqa: S104 - scraped from other hosts
    """Start serving in a daemon thread; the caller ``shutdown()``s the server it gets."""
    server = make_server(host, port, app(token), server_class=_Server, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="saga-worker-metrics", daemon=True).start()
    return server
