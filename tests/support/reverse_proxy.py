"""A real reverse proxy hop for tests: it accepts HTTP on its own port and forwards each request
over a new TCP connection to the web, as a TLS-terminating ingress (nginx, an Ingress controller,
Caddy) does behind the scenes: it appends the address it accepted the connection from to
``X-Forwarded-For`` (what the client wrote further left is kept, and not believed), sets
``X-Forwarded-Proto: https`` (TLS ended here), keeps ``Host``, and drops hop-by-hop headers.

Clients take distinct loopback addresses (``client(address)`` binds 127.0.0.N), so the web sees
one peer, the proxy, while the proxy sees many clients, exactly as in a deployment."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# RFC 9110, section 7.6.1: meaningful for one connection only, never forwarded.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
}


@dataclass(frozen=True)
class Proxy:
    url: str  # where clients reach the proxy
    upstream_port: int


def client(address: str, **options: object) -> httpx.Client:
    """An HTTP client whose connections come from ``address`` (a loopback address: 127.0.0.N)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), **options)  # type: ignore[arg-type]


def _handler(upstream_host: str, upstream_port: int, source: str) -> type[BaseHTTPRequestHandler]:
    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            ours = {"x-forwarded-for", "x-forwarded-proto", "host", "content-length"}
            headers = [(n, v) for n, v in self.headers.items() if n.lower() not in HOP_BY_HOP | ours]
            # What came before (the client's own claim, or an earlier hop's) stays, on the left.
            earlier = ", ".join(self.headers.get_all("X-Forwarded-For") or [])
            peer = self.client_address[0]
            headers.append(("X-Forwarded-For", f"{earlier}, {peer}" if earlier else peer))
            headers.append(("X-Forwarded-Proto", "https"))  # TLS ended here: ours to say
            upstream = http.client.HTTPConnection(
                upstream_host, upstream_port, timeout=30, source_address=(source, 0)
            )
            try:
                upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                upstream.putheader("Host", self.headers.get("Host", ""))
                for name, value in headers:
                    upstream.putheader(name, value)
                upstream.putheader("Content-Length", str(len(body or b"")))
                upstream.endheaders(body)
                answer = upstream.getresponse()
                content = answer.read()
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)
            finally:
                upstream.close()

        do_GET = do_POST = do_HEAD = _forward

    return Forward


@contextmanager
def reverse_proxy(
    upstream_port: int, *, upstream_host: str = "127.0.0.1", source: str = "127.0.0.1"
) -> Iterator[Proxy]:
    """A proxy on a free port of 127.0.0.1 forwarding to ``upstream_host:upstream_port``, its own
    connections to the web coming from ``source``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(upstream_host, upstream_port, source))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Proxy(url=f"http://127.0.0.1:{server.server_address[1]}", upstream_port=upstream_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
