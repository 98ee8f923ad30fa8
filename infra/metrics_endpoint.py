"""A worker's own ``/metrics``, for deployments where the worker does not share a host's metrics
directory with the web (Compose services, Kubernetes pods): its counters and histograms would
otherwise never reach a scrape.

``saga_worker`` starts it on ``SAGA_WORKER_METRICS_PORT`` when that is set: a small HTTP server in
the worker's main process, answering ``GET /metrics`` with the exposition of the files in this
process's metrics directory (the worker and its work horses), behind the same
``Authorization: Bearer $SAGA_METRICS_TOKEN`` as the web's ``/metrics`` (``bearer_matches``). The
gauges read from PostgreSQL and Redis are the web's alone, so nothing is counted twice. On one host
where web and worker share the directory (``make run``, the Procfile), leave the port unset: the
web's scrape already holds the worker's values.

The port is reachable from other hosts, so whoever can connect must not be able to tie the worker
up: one asyncio event loop (one thread) reads every connection's request, so an idle or slow
connection costs a socket, never a thread; a request must arrive whole within
``REQUEST_TIMEOUT_S`` of connecting (or the connection is closed), its head within
``MAX_HEAD_BYTES``; at most ``MAX_CONNECTIONS`` are open at once (more are closed at once); the
token is checked on the request head before anything is read from disk, and the one scrape thread
builds the exposition only for a request that carried it. Each answer closes its connection.

The worker forks (RQ's scheduler process, work horses), and a fork holds a copy of every socket
open at that moment: a connection closed here alone would stay open to its client for as long as
that child lives (a scheduler started mid-request, for the worker's whole life). So a connection
ends with a shutdown, which reaches the client whoever else holds the socket, and a child closes
its copy of the listening socket at once, so the port is free when the worker lets it go.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http.client
import io
import os
import socket
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from infra import exposition as process_exposition

PORT_VARIABLE = "SAGA_WORKER_METRICS_PORT"

# A scraper sends its request as soon as it connects; whoever has sent no whole request head by
# then is closed on. (Prometheus's own scrape timeout defaults to 10 s.)
REQUEST_TIMEOUT_S = 10.0
# The request line and headers a scrape sends fit in far less; more is closed on unread.
MAX_HEAD_BYTES = 16 * 1024
# Open connections at once: each costs a file descriptor and a little memory, no thread. Room for
# many scrapers; past it a new connection is closed at once, so descriptors cannot run out.
MAX_CONNECTIONS = 256

Answer = tuple[str, list[tuple[str, str]], bytes]

# Every server of this process, for the fork hook below.
_SERVERS: weakref.WeakSet[MetricsServer] = weakref.WeakSet()


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
    return generate_latest(process_exposition.process_registry())


def _plain(status: str, text: str, *extra: tuple[str, str]) -> Answer:
    return status, [("Content-Type", "text/plain; charset=utf-8"), *extra], text.encode()


def answer(method: str, path: str, authorization: str, token: str) -> Answer | None:
    """What a request is answered, judged on its head alone: 401 without the token (checked
    first, whatever the path or method), 404 off ``/metrics``, 405 for anything but GET and HEAD;
    None for a scrape the exposition answers."""
    if not bearer_matches(authorization, token):
        return _plain(
            "401 Unauthorized",
            "A valid Authorization: Bearer <SAGA_METRICS_TOKEN> header is required.\n",
            ("WWW-Authenticate", 'Bearer realm="metrics"'),
        )
    if path != "/metrics":
        return _plain("404 Not Found", "Only /metrics is served here.\n")
    if method not in ("GET", "HEAD"):
        return _plain("405 Method Not Allowed", "Only GET.\n", ("Allow", "GET, HEAD"))
    return None


class MetricsServer:
    """The endpoint: listening once constructed (an ``OSError`` if it cannot), serving from
    ``start()`` in a daemon thread until ``shutdown()``; ``server_close()`` releases the port."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        token: str,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.token = token
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self.open_connections = 0
        self.socket = socket.create_server((host, port), backlog=128)
        self.server_address = self.socket.getsockname()
        self._loop = asyncio.new_event_loop()
        # The one thread a scrape's exposition (files read from disk) is built in.
        self._scrape = ThreadPoolExecutor(max_workers=1, thread_name_prefix="saga-worker-metrics-scrape")
        self._stopped: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="saga-worker-metrics", daemon=True)
        _SERVERS.add(self)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def shutdown(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop)
            self._thread.join(timeout=10)
        self._scrape.shutdown(wait=False, cancel_futures=True)

    def server_close(self) -> None:
        self.socket.close()

    def _stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self.socket, limit=MAX_HEAD_BYTES)
        async with server:
            await self._stopped.wait()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open_connections >= self.max_connections:
            _shut(writer, socket.SHUT_RDWR)
            writer.transport.abort()
            return
        self.open_connections += 1
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._exchange(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            # A client that is slow, gone, or sends too much is closed on, with no answer owed.
            _shut(writer, socket.SHUT_RDWR)
        else:
            # Answered: the end is sent once the answer has been (a shutdown after the buffer).
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            self.open_connections -= 1
            writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, _, rest = head.partition(b"\r\n")
        parts = request_line.decode("latin-1").split()
        try:
            headers = http.client.parse_headers(io.BytesIO(rest))
        except http.client.HTTPException:
            parts = []
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            reply: Answer | None = _plain("400 Bad Request", "Not an HTTP/1 request.\n")
            method = "GET"
        else:
            method, target, _version = parts
            path = target.split("?", 1)[0]
            reply = answer(method, path, str(headers.get("Authorization", "")), self.token)
        if reply is None:
            body = await self._loop.run_in_executor(self._scrape, exposition)
            reply = (
                "200 OK",
                [("Content-Type", CONTENT_TYPE_PLAIN_0_0_4), ("Cache-Control", "no-store")],
                body,
            )
        status, fields, body = reply
        lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in fields)]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1"))
        if method != "HEAD":
            writer.write(body)
        await writer.drain()


def _shut(writer: asyncio.StreamWriter, how: int) -> None:
    connection = writer.get_extra_info("socket")
    if connection is not None:
        with contextlib.suppress(OSError):  # already gone
            connection.shutdown(how)


def _in_a_forked_child() -> None:
    """A fork never serves: its copy of each listening socket is closed (detached first, so the
    socket object left behind cannot close a later descriptor of the same number)."""
    for server in list(_SERVERS):
        try:
            descriptor = server.socket.detach()
        except OSError:
            continue
        if descriptor >= 0:
            os.close(descriptor)


os.register_at_fork(after_in_child=_in_a_forked_child)


def serve(
    *,
    port: int,
    token: str,
    host: str = "0.0.0.0",  # noqa: S104 - scraped from other hosts
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsServer:
    """Start serving in a daemon thread; the caller ``shutdown()``s and ``server_close()``s the
    server it gets. (The tests shorten the limits.)"""
    server = MetricsServer(
        host=host,
        port=port,
        token=token,
        request_timeout_s=request_timeout_s,
        max_connections=max_connections,
    )
    return server.start()
