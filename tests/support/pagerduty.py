"""A local stand-in for PagerDuty's Events API v2 (``POST /v2/enqueue``) that checks each event
against the documented shape, strictly, and answers as PagerDuty does: 202 ``{"status":
"success", "message": "Event processed", "dedup_key"}``, or 400 ``{"status": "invalid event",
"message": "Event object is invalid", "errors": [...]}`` naming what is wrong. It keeps every
request and the incidents the accepted events make (by dedup key: triggered, acknowledged,
resolved, as PagerDuty's alerts move), and may be scripted to answer a status first (429, 500…).

The shape (developer.pagerduty.com, Events API v2, "Send an Alert Event"): ``routing_key`` (32
characters), ``event_action`` (trigger, acknowledge, resolve), ``dedup_key`` (at most 255
characters; required to acknowledge or resolve); a trigger's ``payload`` with ``summary`` (1 to
1024 characters), ``source`` and ``severity`` (critical, error, warning, info) required and
``timestamp`` (ISO 8601), ``component``, ``group``, ``class``, ``custom_details`` optional; and
optional ``images``, ``links`` ([{href, text}]), ``client``, ``client_url``. Anything else is
refused here, so a field the sender invents fails the tests.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.processes import http_serving

PATH = "/v2/enqueue"
ACTIONS = ("trigger", "acknowledge", "resolve")
SEVERITIES = ("critical", "error", "warning", "info")
TOP_LEVEL = {"routing_key", "event_action", "dedup_key", "payload", "images", "links", "client", "client_url"}
PAYLOAD = {"summary", "source", "severity", "timestamp", "component", "group", "class", "custom_details"}


def problems(event: Any) -> list[str]:
    """What is wrong with ``event`` by the Events API v2's documented shape ([] when nothing)."""
    if not isinstance(event, dict):
        return ["Event object must be a JSON object."]
    found = [f"Unknown field {name!r}." for name in sorted(set(event) - TOP_LEVEL)]
    key = event.get("routing_key")
    if not isinstance(key, str) or len(key) != 32:
        found.append("Length of 'routing_key' is incorrect (should be 32 characters)")
    action = event.get("event_action")
    if action not in ACTIONS:
        found.append(
            "'event_action' is missing or blank" if not action else f"'event_action' {action!r} is invalid"
        )
    dedup = event.get("dedup_key")
    if dedup is not None and (not isinstance(dedup, str) or not dedup or len(dedup) > 255):
        found.append("'dedup_key' must be a string of 1 to 255 characters")
    if action in ("acknowledge", "resolve") and not dedup:
        found.append(f"'dedup_key' is required to {action}")
    if action == "trigger":
        found += _payload_problems(event.get("payload"))
    links = event.get("links", [])
    if not isinstance(links, list) or not all(
        isinstance(link, dict)
        and isinstance(link.get("href"), str)
        and set(link) <= {"href", "text"}
        and isinstance(link.get("text", ""), str)
        for link in links
    ):
        found.append("'links' must be a list of {href, text}")
    for name in ("client", "client_url"):
        if name in event and not isinstance(event[name], str):
            found.append(f"'{name}' must be a string")
    return found


def _payload_problems(payload: Any) -> list[str]:
    if not isinstance(payload, dict):
        return ["'payload' is missing or not an object"]
    found = [f"Unknown payload field {name!r}." for name in sorted(set(payload) - PAYLOAD)]
    found += _summary_problems(payload.get("summary"))
    source = payload.get("source")
    if not isinstance(source, str) or not source.strip():
        found.append("'payload.source' is missing or blank")
    if payload.get("severity") not in SEVERITIES:
        found.append("'payload.severity' is invalid (expected critical, error, warning or info)")
    if "timestamp" in payload:
        try:
            datetime.fromisoformat(str(payload["timestamp"]))
        except ValueError:
            found.append("'payload.timestamp' is not an ISO 8601 timestamp")
    for name in ("component", "group", "class"):
        if name in payload and not isinstance(payload[name], str):
            found.append(f"'payload.{name}' must be a string")
    if "custom_details" in payload and not isinstance(payload["custom_details"], dict | list | str):
        found.append("'payload.custom_details' must be an object")
    return found


def _summary_problems(summary: Any) -> list[str]:
    if not isinstance(summary, str) or not summary.strip():
        return ["'payload.summary' is missing or blank"]
    if len(summary) > 1024:
        return ["'payload.summary' is longer than 1024 characters"]
    return []


@dataclass
class Sent:
    path: str
    headers: dict[str, str]
    raw: bytes
    status: int

    @property
    def event(self) -> Any:
        return json.loads(self.raw)


@dataclass
class PagerDuty:
    port: int = 0
    received: list[Sent] = field(default_factory=list)
    # Accepted events per dedup key, in order, and each incident's state.
    incidents: dict[str, str] = field(default_factory=dict)
    alerts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Status codes to answer first, in order (then the checked answer).
    script: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = PATH) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def accepted(self) -> list[dict[str, Any]]:
        with self.lock:
            return [sent.event for sent in self.received if sent.status == 202]

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.script:
                status = self.script.pop(0)
                self.received.append(Sent(path, headers, raw, status))
                if status == 429:
                    return status, {"status": "throttle event", "message": "Too many requests; retry later."}
                if status == 400:
                    return status, _invalid(["scripted refusal"])
                return status, {"status": "error", "message": "scripted answer"}
            status, answer = self._checked(path, headers, raw)
            self.received.append(Sent(path, headers, raw, status))
            return status, answer

    def _checked(self, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        if path != PATH:
            return 404, {"status": "not found", "message": f"No route {path}"}
        if not headers.get("Content-Type", "").startswith("application/json"):
            return 400, _invalid(["Content-Type must be application/json"])
        try:
            event = json.loads(raw)
        except ValueError:
            return 400, _invalid(["The body is not JSON"])
        found = problems(event)
        if found:
            return 400, _invalid(found)
        dedup = event.get("dedup_key") or uuid.uuid4().hex
        action = event["event_action"]
        state = self.incidents.get(dedup)
        if action == "trigger":
            if state in (None, "resolved"):
                self.incidents[dedup] = "triggered"
                self.alerts[dedup] = []
            self.alerts[dedup].append(event)
        elif state in ("triggered", "acknowledged"):
            # PagerDuty accepts an acknowledge or resolve of an unknown key and does nothing.
            self.incidents[dedup] = "acknowledged" if action == "acknowledge" else "resolved"
            self.alerts[dedup].append(event)
        return 202, {"status": "success", "message": "Event processed", "dedup_key": dedup}


def _invalid(errors: list[str]) -> dict[str, Any]:
    return {"status": "invalid event", "message": "Event object is invalid", "errors": errors}


@contextmanager
def serve_pagerduty(**options: Any) -> Iterator[PagerDuty]:
    service = PagerDuty(**options)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, answer = service.handle(self.path, dict(self.headers.items()), raw)
            body = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet test output
            return

    with http_serving(Handler) as port:
        service.port = port
        yield service
