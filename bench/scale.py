"""Workers scale out: I/O-bound compensations finished by one worker process, then by several.

Every step's compensator is a webhook whose receiver (a threaded HTTP server in this process)
takes ``delay_s`` (200 ms) per call, as a slow downstream API does: the worker spends its time
waiting, so more worker processes should finish the same independent steps proportionally
faster. Each trial gets its own failed runs (one step each, so every step is independent), and
all their unwinds start in one transaction: the jobs reach Redis together at its commit, and the
clock starts there. Time to the last unwind's ``finished_at``.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from saga_client.signing import verify_signature

TOOL = "bench.webhook_undo"


@dataclass
class Receiver:
    """The downstream system the webhook compensator calls: slow, and it checks the signature."""

    secret: str
    delay_s: float
    port: int = 0
    calls: int = 0
    refused: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.calls = self.refused = self.max_in_flight = 0


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not verify_signature(receiver.secret, dict(self.headers.items()), body):
                with receiver.lock:
                    receiver.refused += 1
                self._reply(401, {"error": "bad signature"})
                return
            with receiver.lock:
                receiver.calls += 1
                receiver.in_flight += 1
                receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
            try:
                time.sleep(receiver.delay_s)
            finally:
                with receiver.lock:
                    receiver.in_flight -= 1
            self._reply(200, {"state": {"undone": json.loads(body).get("action_id")}})

        def _reply(self, status: int, payload: Any) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


@contextmanager
def serve(delay_s: float) -> Iterator[Receiver]:
    receiver = Receiver(secret=secrets.token_urlsafe(32), delay_s=delay_s)
    httpd = _Server(("127.0.0.1", 0), _handler(receiver))
    receiver.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        httpd.shutdown()
        httpd.server_close()


def _failed_runs(count: int, *, label: str) -> list[Any]:
    from bench.unwinds import _failed_run

    return [_failed_run(steps=1, index=i, compensation_tool=TOOL, label=label) for i in range(count)]


def _trial(*, steps: int, workers: int, user: Any, receiver: Receiver, timeout_s: float) -> dict[str, Any]:
    from django.db import transaction

    from bench.unwinds import _start, _wait
    from recovery.models import UnwindStep

    runs = _failed_runs(steps, label=f"{workers}w")
    receiver.reset()
    with transaction.atomic():
        ids = [_start(item, user).pk for _, item in runs]
        # The jobs are queued when this transaction commits (transaction.on_commit): all at once.
        started = time.time()
    done = _wait(ids, timeout_s)
    ends = [d["finished_at"].timestamp() if d["finished_at"] else d["observed"] for d in done.values()]
    elapsed = max(ends) - started
    statuses: dict[str, int] = {}
    for status in UnwindStep.objects.filter(unwind_id__in=ids).values_list("status", flat=True):
        statuses[status] = statuses.get(status, 0) + 1
    total = sum(statuses.values())
    return {
        "workers": workers,
        "unwinds": len(ids),
        "steps": total,
        "seconds": elapsed,
        "steps_per_s": total / elapsed if elapsed else 0.0,
        "per_step_ms": elapsed / total * 1000 if total else 0.0,
        "unwind_statuses": sorted({d["status"] for d in done.values()}),
        "step_statuses": statuses,
        "receiver_calls": receiver.calls,
        "receiver_refused": receiver.refused,
        "receiver_max_concurrent": receiver.max_in_flight,
    }


def measure(
    *,
    steps: int,
    worker_counts: tuple[int, ...],
    delay_s: float,
    log_dir: Path,
    start_workers: Callable[[int], list[Any]],
) -> dict[str, Any]:
    """``start_workers(n)`` starts n Procfile worker processes and returns them once all are
    registered (the harness's job); each trial stops them afterwards."""
    from bench import fixtures
    from bench.unwinds import TENANT, _operator, fixtures_have_key

    out: dict[str, Any] = {"delay_ms": delay_s * 1000, "steps": steps, "trials": {}}
    with serve(delay_s) as receiver:
        fixtures.load_bench_policies(
            log_dir,
            compensators={
                TOOL: {"webhook": f"http://127.0.0.1:{receiver.port}/undo", "secret": receiver.secret}
            },
        )
        if not fixtures_have_key():
            fixtures.agent_keys(tenant_slug=TENANT, count=1)
        user = _operator()
        for n in worker_counts:
            workers = start_workers(n)
            try:
                # Warm every worker (imports, first connections) with steps that are not counted.
                _trial(steps=n, workers=n, user=user, receiver=receiver, timeout_s=120)
                out["trials"][str(n)] = _trial(
                    steps=steps, workers=n, user=user, receiver=receiver, timeout_s=60 + steps * delay_s * 3
                )
            finally:
                for proc in workers:
                    proc.stop()
    trials = out["trials"]
    first, last = str(worker_counts[0]), str(worker_counts[-1])
    if first in trials and last in trials and trials[last]["seconds"]:
        out["speedup"] = trials[first]["seconds"] / trials[last]["seconds"]
    return out
