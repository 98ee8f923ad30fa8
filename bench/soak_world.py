"""The soak's outside parties (bench/soak.py): the agents' loop, which runs in loadgen's
client processes (so nothing here imports Django at import time); the World, the tools'
compensating endpoints that count what they receive per idempotency key; and the operator, who
compensates through the API."""

from __future__ import annotations

import http.client
import json
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TENANT = "soak"
# The onboarding saga's tools as the demo world names them (demo/policies/native.json): each
# forward tool and the webhook path of its compensating tool on the harness's World.
STEPS = (
    ("hr.create_user", "hr.delete_user", "/hr/delete_user"),
    ("workspace.provision_license", "workspace.cancel_license", "/workspace/cancel_license"),
    ("email.send_welcome", "email.send_correction", "/email/send_correction"),
)
# Statuses an agent retries (a real client's SDK does, with the same idempotency key): a 5xx, or
# no answer at all (0). Everything else ends the request.
RETRIES = 3


# --- The agents (in loadgen's client processes) ------------------------------------------------


def _call(
    client: Any,
    record: Callable[..., bool],
    op: str,
    method: str,
    path: str,
    body: Any,
    expected: int,
) -> tuple[int, Any, bool]:
    """One API call, retried on a 5xx or a lost connection as a client SDK does: (status, JSON
    body, go on?). Every attempt is a sample, so every 5xx is counted."""
    status, data, keep = 0, None, True
    for attempt in range(RETRIES):
        started = time.perf_counter()
        try:
            status, raw, _ = client.request(method, path, body)
            data = json.loads(raw) if raw else None
        except (OSError, http.client.HTTPException, ValueError):
            status, data = 0, None
            client.conn.close()
        # A retry whose earlier attempt went through but lost its answer: a record is replayed (200
        # for its 201), a transition (the 200s) is already made (409). Neither is an error.
        done_before = attempt > 0 and (
            status == 200 if expected == 201 else status == 409 and expected == 200
        )
        keep = record(op, started, status, status if done_before else expected)
        if status == expected or done_before or not keep:
            return (expected if done_before else status), data, keep
        if 0 < status < 500:
            return status, data, keep
        time.sleep(0.5 * (attempt + 1))
    return status, data, keep


def _saga(client: Any, index: int, n: int, params: dict[str, Any], record: Callable[..., bool]) -> bool:
    """One onboarding: create the run, then each step recorded-and-started and succeeded; a failing
    saga's last step fails, then the run. False once the load is over."""
    fails = n % params["fail_every"] == params["fail_every"] - 1
    # A failing saga fails at the email (two steps to undo) or, every other time, at the licence.
    fail_at = (len(STEPS) - 1 if (n // params["fail_every"]) % 2 == 0 else 1) if fails else None
    email = f"hire-{index}-{n}@example.com"
    status, run, keep = _call(
        client,
        record,
        "create_run",
        "POST",
        "/api/v1/runs",
        {
            "agent": f"soak-agent-{index}",
            "request": f"Onboard new hire {email}",
            "external_id": f"soak-{index}-{n}-{'fail' if fails else 'ok'}",
        },
        201,
    )
    if status != 201 or not keep:
        return keep
    run_id = run["id"]
    for position, (tool, _, _) in enumerate(STEPS):
        time.sleep(params["think_s"])
        body = {
            "tool": tool,
            "target_type": tool.split(".", 1)[0],
            "target_id": email,
            "args": {"email": email, "n": n},
            "idempotency_key": f"{run_id}:{position}",
            "intent": {"reasoning": f"onboarding step {position + 1}", "confidence": 0.9},
            "compensation": {"tool": STEPS[position][1], "args": {"email": email}},
            "start": True,
        }
        status, action, keep = _call(
            client, record, "record_start", "POST", f"/api/v1/runs/{run_id}/actions", body, 201
        )
        if status != 201 or not keep:
            return keep
        if position == fail_at:
            status, _, keep = _call(
                client,
                record,
                "action_fail",
                "POST",
                f"/api/v1/actions/{action['id']}/fail",
                {"error": "the tool answered 503", "retryable": False, "layer": "tool"},
                200,
            )
            if status != 200 or not keep:
                return keep
            _, _, keep = _call(
                client,
                record,
                "run_fail",
                "POST",
                f"/api/v1/runs/{run_id}/fail",
                {"error": f"{tool} failed", "failed_action_id": action["id"]},
                200,
            )
            return keep
        status, _, keep = _call(
            client,
            record,
            "succeed",
            "POST",
            f"/api/v1/actions/{action['id']}/succeed",
            {"result": {"ok": True}, "after_snapshot": {"email": email, "step": position}},
            200,
        )
        if status != 200 or not keep:
            return keep
    _, _, keep = _call(client, record, "complete", "POST", f"/api/v1/runs/{run_id}/complete", {}, 200)
    return keep


def agent_sagas(client: Any, index: int, params: dict[str, Any], record: Callable[..., bool]) -> None:
    """loadgen's ``onboarding_saga`` scenario: sagas one after another until the load ends."""
    n = 0
    while _saga(client, index, n, params, record):
        n += 1


# --- The tools' system: webhook compensators that count effects per key ------------------------


@dataclass
class World:
    """The HR, workspace and email systems' compensating endpoints. Every call is kept; like a
    well-behaved tool it applies an undo once per Idempotency-Key (a repeat is answered and does
    nothing again), so ``effects`` counts effects per forward action: an engine that sent a second
    key for one undo would show as two effects for that action."""

    secret: str
    delay_s: float
    port: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    applied_keys: set[str] = field(default_factory=set)
    effects: Counter[str] = field(default_factory=Counter)
    in_flight: Counter[str] = field(default_factory=Counter)
    overlaps: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _world_handler(world: World) -> type[BaseHTTPRequestHandler]:
    from saga_client.signing import verify_signature

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Keep-alive without TCP_NODELAY: the body, a second small write after the headers,
        # waits for the client's delayed ACK (~40 ms on Linux), which measured the receiver,
        # not the worker: 44 ms a call against 0.6 ms with it (bench/unwind_profile.py).
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not verify_signature(world.secret, dict(self.headers.items()), raw):
                with world.lock:
                    world.refused += 1
                self._reply(401, {"error": "bad signature"})
                return
            body = json.loads(raw or b"{}")
            key = self.headers.get("Idempotency-Key", "")
            action_id = str(body.get("action_id", ""))
            with world.lock:
                world.calls.append(
                    {
                        "path": self.path,
                        "key": key,
                        "action_id": action_id,
                        "run_id": body.get("run_id"),
                        "step_id": body.get("step_id"),
                        "attempt": body.get("attempt"),
                        "at": time.time(),
                    }
                )
                if key and world.in_flight[key]:
                    world.overlaps += 1
                world.in_flight[key] += 1
                if key and key not in world.applied_keys:
                    world.applied_keys.add(key)
                    world.effects[action_id] += 1
            try:
                if not key:
                    self._reply(422, {"error": "Idempotency-Key is required"})
                    return
                time.sleep(world.delay_s)
                self._reply(200, {"state": {"undone": action_id}})
            finally:
                with world.lock:
                    world.in_flight[key] -= 1

        def _reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the worker that called was killed: nobody is listening

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            return

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A worker SIGKILLed with its keep-alive connection open resets it: part of the script.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serve_world(delay_s: float) -> Iterator[World]:
    world = World(secret=secrets.token_urlsafe(32), delay_s=delay_s)
    httpd = _Server(("127.0.0.1", 0), _world_handler(world))
    world.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield world
    finally:
        httpd.shutdown()
        httpd.server_close()


# --- The operator -------------------------------------------------------------------------------


class Operator:
    """A person at the recovery queue, through the API with an operator key: every open item is
    compensated as soon as it is seen (an item an unwind reopened is open again, and compensated
    again). Polls every ``interval_s``; its requests are bounded by that and by ``stop``."""

    def __init__(self, port: int, secret: str, t0: Callable[[], float], interval_s: float = 0.5) -> None:
        self.port, self.interval_s, self.t0 = port, interval_s, t0
        self.headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        self.decisions: list[dict[str, Any]] = []
        self.statuses: Counter[str] = Counter()
        self.polls = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="soak-operator")
        self.conn: http.client.HTTPConnection | None = None

    def _request(self, op: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        payload = json.dumps(body).encode() if body is not None else None
        for _attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                self.conn.request(method, path, body=payload, headers=self.headers)
                response = self.conn.getresponse()
                raw = response.read()
                if response.will_close:
                    self.conn.close()
                    self.conn = None
                self.statuses[f"{op}:{response.status}"] += 1
                try:
                    return response.status, json.loads(raw) if raw else None
                except ValueError:
                    return response.status, None
            except (OSError, http.client.HTTPException):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
        self.statuses[f"{op}:0"] += 1
        return 0, None

    def _open_items(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        path = "/api/v1/recovery?status=open&limit=200"
        for _page in range(50):
            status, data = self._request("list", "GET", path)
            if status != 200 or not isinstance(data, dict):
                break
            items += data.get("items", [])
            cursor = data.get("next_cursor")
            if not cursor:
                break
            path = f"/api/v1/recovery?status=open&limit=200&cursor={cursor}"
        return items

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self.polls += 1
            # Oldest first: the queue is worked in the order the failures came in.
            for item in reversed(self._open_items()):
                if self.stopping.is_set():
                    break
                asked = time.time()
                status, data = self._request(
                    "compensate",
                    "POST",
                    f"/api/v1/recovery/{item['id']}/compensate",
                    {"reason": "soak: undo the failed onboarding"},
                )
                if status == 202 and isinstance(data, dict):
                    self.decisions.append(
                        {
                            "item_id": item["id"],
                            "run_id": data.get("run_id") or item.get("run_id"),
                            "unwind_id": data.get("id"),
                            "at_s": asked - self.t0(),
                        }
                    )
            self.stopping.wait(self.interval_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=60)
        if self.conn is not None:
            self.conn.close()
