"""A reference webhook compensator for the compensator checks (the client's saga-compensator-check
and the dashboard's harmless check): it cancels one licence seat, answers the protocol as a sound
compensator does, and can be broken one way at a time (``Flaws``). It keeps every request it got,
so a test can prove what a check sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from saga_client.signing import verify_signature

from tests.support.processes import http_serving

SECRET = "check-kit-secret"


@dataclass
class Flaws:
    accepts_any_signature: bool = False
    not_idempotent: bool = False
    rejects_unknown_fields: bool = False
    crashes_on_malformed_body: bool = False
    ignores_drift: bool = False
    delay_s: float = 0.0
    # The reader at /read (a policy file's ``readers``): broken one way at a time too.
    reader_accepts_any_signature: bool = False
    reader_answers_bare_state: bool = False


@dataclass
class Reference:
    """A licence seat that the compensator cancels; its state is the number of cancellations and
    whether the seat is active."""

    flaws: Flaws
    active: bool = True
    cancellations: int = 0
    answers: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, headers: Any, raw: bytes) -> tuple[int, dict[str, Any]]:
        self.received.append((dict(headers.items()), raw))
        if not self.flaws.accepts_any_signature and not verify_signature(SECRET, headers, raw):
            return 401, {"error": "bad signature"}
        try:
            body = json.loads(raw)
        except ValueError:
            if self.flaws.crashes_on_malformed_body:
                return 500, {"error": "Traceback (most recent call last): ..."}
            return 400, {"error": "not JSON"}
        known = {"step_id", "action_id", "run_id", "tenant", "tool", "args", "target_type", "target_id",
                 "before_snapshot", "after_snapshot", "attempt"}  # fmt: skip
        if self.flaws.rejects_unknown_fields and set(body) - known:
            return 500, {"error": f"unexpected fields {sorted(set(body) - known)}"}
        key = headers.get("Idempotency-Key", "")
        args = body.get("args")
        if not isinstance(args, dict) or args.get("seat") != "seat-1":
            return 422, {"error": "args.seat names no seat"}
        with self.lock:
            if key in self.answers and not self.flaws.not_idempotent:
                return self.answers[key]
            after = body.get("after_snapshot") or {}
            if not self.flaws.ignores_drift and after.get("seat") not in (None, "seat-1"):
                return 412, {"error": "drifted"}
            time.sleep(self.flaws.delay_s)  # the work is slow; refusing is not
            if not self.active and not self.flaws.not_idempotent:
                answer = (409, {"state": {"active": False}})
            else:
                self.active = False
                self.cancellations += 1
                answer = (200, {"state": {"active": False}})
            self.answers[key] = answer
            return answer

    def read(self, headers: Any, raw: bytes) -> tuple[int, dict[str, Any]]:
        """The seat's reader: a signed ``{"tool", "args", …}`` read answers ``{"state": …}``."""
        self.received.append((dict(headers.items()), raw))
        if not self.flaws.reader_accepts_any_signature and not verify_signature(SECRET, headers, raw):
            return 401, {"error": "bad signature"}
        seat = {"seat": {"id": "seat-1", "active": self.active}}
        return 200, seat if self.flaws.reader_answers_bare_state else {"state": seat}

    def state(self) -> dict[str, Any]:
        return {"active": self.active, "cancellations": self.cancellations}


@contextmanager
def reference_compensator(flaws: Flaws) -> Iterator[tuple[str, Reference]]:
    """Serves the reference compensator at /cancel and its state at /state; yields the base URL
    and the reference (its state and the requests it received)."""
    reference = Reference(flaws)

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/read":
                self._answer(*reference.read(self.headers, raw))
                return
            self._answer(*reference.handle(self.headers, raw))

        def do_GET(self) -> None:
            if self.path == "/seat":
                self._answer(200, {"seat": {"id": "seat-1", "active": reference.active}})
                return
            self._answer(200, reference.state())

        def log_message(self, *args: Any) -> None:
            pass

    with http_serving(Handler) as port:
        yield f"http://127.0.0.1:{port}", reference
