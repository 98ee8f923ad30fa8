"""``make bench``'s workers phase (its section: "Workers scale-out"): I/O-bound compensations
finished by one worker process, then by several.

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
from typing import TYPE_CHECKING, Any

from saga_client.signing import verify_signature

from bench import fixtures
from bench.stats import log
from bench.tables import fmt
from bench.unwinds import TENANT, failed_run, fixtures_have_key, operator, start_unwind, wait_finished

if TYPE_CHECKING:
    from bench.harness import Harness

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
        # Keep-alive without TCP_NODELAY: the body, a second small write after the headers,
        # waits for the client's delayed ACK (~40 ms on Linux), which measured the receiver,
        # not the worker: 44 ms a call against 0.6 ms with it (bench/unwind_profile.py).
        disable_nagle_algorithm = True

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
    return [failed_run(steps=1, index=i, compensation_tool=TOOL, label=label) for i in range(count)]


def _trial(*, steps: int, workers: int, user: Any, receiver: Receiver, timeout_s: float) -> dict[str, Any]:
    from django.db import transaction

    from recovery.models import UnwindStep

    runs = _failed_runs(steps, label=f"{workers}w")
    receiver.reset()
    with transaction.atomic():
        ids = [start_unwind(item, user).pk for _, item in runs]
        # The jobs are queued when this transaction commits (transaction.on_commit): all at once.
        started = time.time()
    done = wait_finished(ids, timeout_s)
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
        user = operator()
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


# --- The phase ------------------------------------------------------------------------------


# Worker processes compared in the scale-out section, and the downstream delay of each call.
# The target asks 1, 2 and 4 worker processes measured (4 ≥ 3.5x 1 on I/O-bound steps).
SCALE_WORKERS = (1, 2, 4)
SCALE_DELAY_S = 0.2


def phase(h: Harness) -> None:
    log(
        f"workers: {h.sizes.scale_steps} webhook compensations of {SCALE_DELAY_S * 1000:.0f} ms "
        f"by {' then '.join(map(str, SCALE_WORKERS))} Procfile worker process(es)"
    )
    h.section("workers").update(
        measure(
            steps=h.sizes.scale_steps,
            worker_counts=SCALE_WORKERS,
            delay_s=SCALE_DELAY_S,
            log_dir=h.log_dir,
            start_workers=h.start_workers,
        )
    )
    # The same steps against a receiver that answers at once: one worker's compensation
    # throughput on no-op webhook steps, to hold against RQ's in-process no-op job rate (the
    # unwind phase's L3 on the SimpleWorker candidate; the target is at least half).
    log(f"workers: {h.sizes.scale_steps} no-op webhook compensations by 1 Procfile worker process")
    h.section("workers")["noop"] = measure(
        steps=h.sizes.scale_steps,
        worker_counts=(1,),
        delay_s=0.0,
        log_dir=h.log_dir,
        start_workers=h.start_workers,
    )


# --- The report -----------------------------------------------------------------------------


def rows(workers: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for n, trial in workers.get("trials", {}).items():
        rows.append(
            [
                f"workers: {trial['steps']} webhook steps of {workers.get('delay_ms', 0):.0f} ms",
                f"{n} worker(s)",
                fmt(trial["steps_per_s"]) + " steps",
                fmt(trial["per_step_ms"], 2) + " /step",
                fmt(trial["seconds"], 2) + " s total",
                "–",
                fmt(trial["step_statuses"].get("failed", 0) + trial["receiver_refused"]),
                f"≤ {trial['receiver_max_concurrent']} calls at once",
            ]
        )
    return rows


def targets(workers: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    trials = workers.get("trials", {})
    if workers.get("speedup") and trials:
        counts = sorted(trials, key=int)
        one, many = trials[counts[0]], trials[counts[-1]]
        clean = all(t["unwind_statuses"] == ["completed"] for t in trials.values())
        out.append(
            (
                f"{counts[-1]} worker processes finish {many['steps']} I/O-bound steps ≥ 3× faster than {counts[0]}",
                f"{one['seconds']:.1f} s vs {many['seconds']:.1f} s = {workers['speedup']:.2f}x",
                workers["speedup"] >= 3 and clean,
            )
        )
    else:
        out.append(("4 worker processes finish 200 I/O-bound steps ≥ 3× faster than 1", "not measured", None))
    return out


def markdown(workers: dict[str, Any]) -> list[str]:
    out = [
        "## Workers scale-out",
        "",
        "I/O-bound compensations: every step's compensator is a webhook (loaded from the policy file, as an "
        "operator configures one) whose receiver, a threaded HTTP server in the benchmark process, checks the "
        f"signature and takes {workers.get('delay_ms', 200):.0f} ms to answer. Each trial fails its own runs, "
        "one step each (independent steps), starts all their unwinds in one transaction (the jobs reach Redis "
        "together when it commits, and the clock starts there) and stops at the last unwind's `finished_at`, "
        "with 1, 2, then 4 processes of the Procfile's worker line, each warmed by a few uncounted steps.",
        "",
    ]
    trials = workers.get("trials", {})
    if not trials:
        return [*out, "Not measured in this run.", ""]
    out += [
        "| worker processes | steps | seconds | steps /s | ms per step | receiver calls at once (max) | "
        "unwinds | steps by status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, t in sorted(trials.items(), key=lambda kv: int(kv[0])):
        out.append(
            f"| {n} | {t['steps']} | {t['seconds']:.2f} | {t['steps_per_s']:.1f} | {t['per_step_ms']:.1f} | "
            f"{t['receiver_max_concurrent']} | {', '.join(t['unwind_statuses'])} | {t['step_statuses']} |"
        )
    if workers.get("speedup"):
        out += ["", f"Speed-up: **{workers['speedup']:.2f}x** (target ≥ 3.5x)."]
    noop = workers.get("noop", {}).get("trials", {}).get("1")
    if noop:
        out += [
            "",
            f"The same steps against a receiver that answers at once, one worker process: {noop['steps']} "
            f"no-op webhook steps in {noop['seconds']:.2f} s = **{noop['steps_per_s']:.1f} steps/s** "
            f"({noop['per_step_ms']:.1f} ms a step; the target: at least half of RQ's in-process no-op job "
            "rate, the Unwind section's L3 on the `simple` candidate).",
        ]
    out.append("")
    return out
