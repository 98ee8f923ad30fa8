"""A local HTTP endpoint that keeps every request it gets and answers from a script: stands in for a
tenant's webhook receiver, a Slack incoming webhook, a Slack ``response_url`` or (with a ``check``:
``tests.support.teams``) a Teams Workflows webhook in the notification tests."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.processes import http_serving


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


@dataclass
class Receiver:
    port: int = 0
    received: list[Received] = field(default_factory=list)
    # Status codes to answer with, in order; then 200.
    script: list[int] = field(default_factory=list)
    delay_s: float = 0.0
    # Checks each body: a complaint ("" when none) is answered 400 with it (a Teams card's schema).
    check: Callable[[bytes], str] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def next_status(self) -> int:
        with self.lock:
            return self.script.pop(0) if self.script else 200


@contextmanager
def serve_receiver(**options: Any) -> Iterator[Receiver]:
    receiver = Receiver(**options)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with receiver.lock:
                receiver.received.append(Received(self.path, dict(self.headers.items()), raw))
            if receiver.delay_s:
                time.sleep(receiver.delay_s)
            status = receiver.next_status()
            body = b"ok" if status < 400 else b"no_service"
            complaint = receiver.check(raw) if receiver.check is not None else ""
            if complaint:
                status, body = 400, complaint.encode()[:2000]
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            return

    with http_serving(Handler) as port:
        receiver.port = port
        yield receiver
