"""The one HTTP load generator used for L2 and for every app measurement, so their ratio is fair.

Shape: ``processes`` client processes (spawned, so none inherits the orchestrator's Django or
database state), each running ``clients / processes`` threads; every thread is one client with
one keep-alive ``http.client`` connection, reopened when the server closes it (gunicorn's sync
worker answers ``Connection: close``; that cost is the server's and counts against both sides).

Every request records its latency; a request counts when it *started* inside the measurement
window, after a warm-up that is thrown away. Throughput = counted completions / window.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing as mp
import resource
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A scenario is run once per client; ``client`` is the client's index (0..clients-1) and
# ``params`` is whatever the orchestrator prepared (run ids, keys, the body to post...).


@dataclass
class Sample:
    op: str
    started: float
    latency: float
    status: int


@dataclass
class LoadResult:
    clients: int
    processes: int
    window_s: float
    samples: list[Sample] = field(default_factory=list)
    client_cpu_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    # Every request made, warm-up included (to divide the server's CPU time by).
    requests_total: int = 0
    server_cpu_ms_per_request: float | None = None
    # Query counts seen per op, from the bench-only X-Bench-Queries response header.
    queries: dict[str, set[int]] = field(default_factory=dict)

    def add(self, out: list[Any], errors: dict[str, int], cpu: float) -> None:
        """One client process's samples, errors and CPU time."""
        self.samples.extend(Sample(op, started, latency, status) for op, started, latency, status, _ in out)
        self.client_cpu_s += cpu
        self.requests_total += errors.pop("_made", 0)
        for key, value in errors.items():
            self.errors[key] = self.errors.get(key, 0) + value
        # Query counts from the bench-only response header, kept per op (pages).
        for op, _, _, _, queries in out:
            if queries is not None:
                self.queries.setdefault(op, set()).add(int(queries))

    def ops(self) -> list[str]:
        return sorted({s.op for s in self.samples})

    def latencies(self, op: str | None = None) -> list[float]:
        return sorted(s.latency for s in self.samples if op is None or s.op == op)

    def count(self, op: str | None = None) -> int:
        return sum(1 for s in self.samples if op is None or s.op == op)

    def error_count(self) -> int:
        return sum(self.errors.values())

    def throughput(self, op: str | None = None) -> float:
        return self.count(op) / self.window_s if self.window_s else 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, int(round(q / 100 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[rank]


class Client:
    """One keep-alive connection; ``request`` reconnects when the server closed it."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None) -> None:
        self.host, self.port = host, port
        self.headers = headers or {}
        self.conn = http.client.HTTPConnection(host, port, timeout=30)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, http.client.HTTPResponse]:
        payload = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        all_headers = {**self.headers, **(headers or {})}
        if payload is not None:
            all_headers.setdefault("Content-Type", "application/json")
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=payload, headers=all_headers)
                response = self.conn.getresponse()
                data = response.read()
                if response.will_close:
                    self.conn.close()
                return response.status, data, response
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                # A keep-alive connection the server dropped between requests: reopen once.
                self.conn.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")


# --- Scenarios -------------------------------------------------------------------------------


def scenario_post_json(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """POST the same small JSON body to one path (the L2 no-op app)."""
    body = json.dumps(params["body"]).encode()
    while True:
        t = time.perf_counter()
        status, _, _ = client.request("POST", params["path"], body)
        if not record("post", t, status, 201):
            return


def _action_body(run_id: str, n: int, tool: str = "bench.update_record") -> dict[str, Any]:
    return {
        "tool": tool,
        "target_type": "record",
        "target_id": f"{run_id}-{n}",
        "args": {"field": "status", "value": "active", "n": n},
        "idempotency_key": f"{run_id}:{n}:{uuid.uuid4().hex[:8]}",
        "intent": {"reasoning": "benchmark: set the record active", "confidence": 0.9},
        "compensation": {"tool": "bench.undo", "args": {"n": n}},
    }


def _runs_for(index: int, params: dict[str, Any]) -> list[str]:
    return params["runs"][index]


def megabyte_args() -> dict[str, Any]:
    """Args that bring a record just under 1 MiB, as ~95,000 small objects: the costliest megabyte
    to parse, hash, store and echo back."""
    return {"items": [{"k": i % 10} for i in range(94_000)]}


def scenario_record_action(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """POST /api/v1/runs/{id}/actions, a fresh run every ``per_run`` actions; with
    ``params["megabyte"]`` each record carries ``megabyte_args`` (built once, in the client)."""
    runs = _runs_for(index, params)
    per_run = params["per_run"]
    op = params.get("op", "record_action")
    big = megabyte_args() if params.get("megabyte") else None
    n = 0
    while True:
        run_id = runs[min(n // per_run, len(runs) - 1)]
        action = _action_body(run_id, n, params.get("tool", "bench.update_record"))
        if big is not None:
            action["args"] = {**big, "n": n}
        body = json.dumps(action).encode()
        t = time.perf_counter()
        status, _, _ = client.request("POST", f"/api/v1/runs/{run_id}/actions", body)
        n += 1
        if not record(op, t, status, 201):
            return


def scenario_record_plan(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """POST /api/v1/runs/{id}/plan with ``plan_size`` actions (each a fresh key), a fresh run every
    ``per_run`` actions. One sample per plan: its latency is the request's; the actions it
    recorded are ``plan_size`` times the count."""
    runs = _runs_for(index, params)
    per_run, size = params["per_run"], params["plan_size"]
    n = 0
    while True:
        run_id = runs[min(n // per_run, len(runs) - 1)]
        body = json.dumps({"actions": [_action_body(run_id, n + i) for i in range(size)]}).encode()
        t = time.perf_counter()
        status, _, _ = client.request("POST", f"/api/v1/runs/{run_id}/plan", body)
        n += size
        if not record("record_plan", t, status, 201):
            return


def scenario_action_lifecycle(
    client: Client,
    index: int,
    params: dict[str, Any],
    record: Callable[..., bool],
) -> None:
    """record → start → succeed for one action at a time; also times the whole sequence."""
    runs = _runs_for(index, params)
    per_run = params["per_run"]
    n = 0
    while True:
        run_id = runs[min(n // per_run, len(runs) - 1)]
        t0 = time.perf_counter()
        status, data, _ = client.request("POST", f"/api/v1/runs/{run_id}/actions", _action_body(run_id, n))
        n += 1
        keep = record("record_action", t0, status, 201)
        if status != 201:
            if not keep:
                return
            continue
        action_id = json.loads(data)["id"]
        t1 = time.perf_counter()
        status, _, _ = client.request("POST", f"/api/v1/actions/{action_id}/start", b"{}")
        keep = record("start", t1, status, 200)
        if status != 200:
            if not keep:
                return
            continue
        t2 = time.perf_counter()
        status, _, _ = client.request(
            "POST",
            f"/api/v1/actions/{action_id}/succeed",
            {"result": {"ok": True}, "after_snapshot": {"status": "active"}},
        )
        keep = record("succeed", t2, status, 200)
        if status == 200:
            # The sequence's latency, counted in the window its first request started in.
            record("sequence", t0, 200, 200)
        if not keep:
            return


def scenario_get_checkpoints(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """The framework floor: GET /api/v1/runs/{id}/checkpoints, the project's cheapest
    authenticated request (the key, the run's ownership, one small page), on the client's run."""
    path = f"/api/v1/runs/{_runs_for(index, params)[0]}/checkpoints"
    while True:
        t = time.perf_counter()
        status, _, _ = client.request("GET", path)
        if not record("checkpoints", t, status, 200):
            return


def scenario_get_path(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """GET the client's own path (``params["paths_per_client"][index]``) again and again, timed as
    ``params["op"]``: an authenticated read of the client's own run (bench/reads.py)."""
    path, op = params["paths_per_client"][index], params["op"]
    while True:
        t = time.perf_counter()
        status, _, _ = client.request("GET", path)
        if not record(op, t, status, 200):
            return


def scenario_heartbeat(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """POST /api/v1/runs/{id}/heartbeat on the client's run, as a live agent does all the time."""
    path = f"/api/v1/runs/{_runs_for(index, params)[0]}/heartbeat"
    while True:
        t = time.perf_counter()
        status, _, _ = client.request("POST", path, b"{}")
        if not record("heartbeat", t, status, 200):
            return


def scenario_full_step(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """One tool call as the client records it: record with ``start: true`` (201, running) →
    succeed (200); also times the pair as ``step``, the cost of a tool call to the agent."""
    runs = _runs_for(index, params)
    per_run = params["per_run"]
    n = 0
    while True:
        run_id = runs[min(n // per_run, len(runs) - 1)]
        t0 = time.perf_counter()
        body = {**_action_body(run_id, n), "start": True}
        status, data, _ = client.request("POST", f"/api/v1/runs/{run_id}/actions", body)
        n += 1
        running = status == 201 and json.loads(data).get("status") == "running"
        keep = record("record_start", t0, status if running or status != 201 else 0, 201)
        if not running:
            if not keep:
                return
            continue
        action_id = json.loads(data)["id"]
        t1 = time.perf_counter()
        status, _, _ = client.request(
            "POST",
            f"/api/v1/actions/{action_id}/succeed",
            {"result": {"ok": True}, "after_snapshot": {"status": "active"}},
        )
        keep = record("succeed", t1, status, 200)
        if status == 200:
            record("step", t0, 200, 200)
        if not keep:
            return


def scenario_get_pages(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """GET each page in turn (dashboard pages as a logged-in operator)."""
    pages: list[tuple[str, str]] = params["pages"]
    i = 0
    while True:
        name, path = pages[i % len(pages)]
        i += 1
        t = time.perf_counter()
        status, _, response = client.request("GET", path)
        queries = response.getheader("X-Bench-Queries")
        if not record(name, t, status, 200, queries=queries):
            return


def megabyte_body(*, extra_field: bool = False) -> bytes:
    """A run body just under 1 MiB (the default body limit, so it is not refused on its declared
    length) made of ~95,000 small objects: the costliest megabyte to parse and check (360 ms of
    it, when an unauthenticated body was still parsed). ``extra_field`` adds a field the schema
    does not know, so a request that gets as far as validation is a 422 and creates nothing."""
    items = [{"k": i % 10} for i in range(95_000)]
    body: dict[str, Any] = {"agent": "bench", "request": "r", "metadata": {"items": items}}
    if extra_field:
        body["unknown_field"] = True
    return json.dumps(body).encode()


def raw_post(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    """POST over a fresh socket the way a careful client does: send the body while watching for
    an early answer, and stop sending once the whole response is in (a server that refuses from
    the headers answers before it has read the body and then closes). The status, or 0 when the
    connection was lost before a whole response arrived."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    out = memoryview(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    sent, data, expected_end = 0, b"", None
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.setblocking(False)
        while expected_end is None or len(data) < expected_end:
            writing = [sock] if sent < len(out) else []
            readable, writable, _ = select.select([sock], writing, [], 30)
            if not readable and not writable:
                return 0
            if writable:
                try:
                    sent += sock.send(out[sent : sent + 65536])
                except (BrokenPipeError, ConnectionResetError):
                    sent = len(out)  # the server stopped reading: its answer may already be here
            if readable:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    return 0
                if not chunk:
                    return 0
                data += chunk
                if expected_end is None:
                    expected_end = _response_end(data)
    return int(data.split(b" ", 2)[1])


def _response_end(data: bytes) -> int | None:
    """Where the response that ``data`` begins ends (its head, then Content-Length bytes), once
    its head is in; None before."""
    if b"\r\n\r\n" not in data:
        return None
    head = data.split(b"\r\n\r\n", 1)[0]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return len(head) + 4 + length


def scenario_post_raw(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """One POST per fresh connection with ``raw_post``: ``params["body"]`` is "tiny" or
    "megabyte" (built here, in the client process), ``params["expected"]`` the status it must get."""
    kind = params["body"]
    body = b'{"agent": "bench", "request": "r"}' if kind == "tiny" else megabyte_body(extra_field=True)
    headers = dict(params.get("headers", {}))
    while True:
        t = time.perf_counter()
        status = raw_post(client.host, client.port, params["path"], body, headers)
        if not record(params["op"], t, status, params["expected"]):
            return


def scenario_onboarding_saga(
    client: Client, index: int, params: dict[str, Any], record: Callable[..., bool]
) -> None:
    """The soak's agent (bench/soak_world.py): onboarding sagas one after another."""
    from bench.soak_world import agent_sagas

    agent_sagas(client, index, params, record)


SCENARIOS: dict[str, Callable[..., None]] = {
    "post_json": scenario_post_json,
    "post_raw": scenario_post_raw,
    "record_action": scenario_record_action,
    "record_plan": scenario_record_plan,
    "action_lifecycle": scenario_action_lifecycle,
    "get_pages": scenario_get_pages,
    "get_checkpoints": scenario_get_checkpoints,
    "get_path": scenario_get_path,
    "heartbeat": scenario_heartbeat,
    "full_step": scenario_full_step,
    "onboarding_saga": scenario_onboarding_saga,
}


# --- Processes and threads -------------------------------------------------------------------


def _client_thread(
    scenario: str,
    host: str,
    port: int,
    headers: dict[str, str],
    index: int,
    params: dict[str, Any],
    start_at: float,
    warmup_s: float,
    window_s: float,
    out: list[Any],
    errors: dict[str, int],
    lock: threading.Lock,
    stop: Any = None,
) -> None:
    client = Client(host, port, headers=dict(headers, **params.get("headers_per_client", {}).get(index, {})))
    window_start, window_end = start_at + warmup_s, start_at + warmup_s + window_s
    max_requests = params.get("max_requests_per_client")
    made = 0
    stopped_at: float | None = None

    def record(op: str, started: float, status: int, expected: int, **extra: Any) -> bool:
        nonlocal made, stopped_at, window_end
        now = time.perf_counter()
        if stop is not None and stopped_at is None and stop[0].is_set():
            # Ended early by the orchestrator (LoadControl): the window closed when it said so (its
            # wall-clock time in this process's perf_counter); a request in flight then still
            # counts, one started after it does not.
            stopped_at = now
            window_end = min(window_end, now + (stop[1].value - time.time()))
        if window_start <= started < window_end:
            out.append((op, started, now - started, status, extra.get("queries")))
            if status != expected:
                with lock:
                    key = f"{op}:{status}"
                    errors[key] = errors.get(key, 0) + 1
        if op not in ("sequence", "step"):  # pseudo-ops timing several requests, not requests
            made += 1
        if max_requests is not None and made >= max_requests:
            return False
        return now < window_end and stopped_at is None

    while time.perf_counter() < start_at:
        time.sleep(0.001)
    try:
        SCENARIOS[scenario](client, index, params, record)
    except Exception as exc:  # noqa: BLE001 - a client crash is reported as an error, not hidden
        with lock:
            key = f"exception:{type(exc).__name__}"
            errors[key] = errors.get(key, 0) + 1
    with lock:
        errors["_made"] = errors.get("_made", 0) + made


def _process_main(
    scenario: str,
    host: str,
    port: int,
    headers: dict[str, str],
    indexes: list[int],
    params: dict[str, Any],
    start: Any,
    warmup_s: float,
    window_s: float,
    queue: Any,
    stop: Any = None,
) -> None:
    # Ready (the interpreter and its imports are up): wait for the shared start time, which the
    # parent sets once every process is ready — a busy machine can take seconds to spawn one.
    queue.put("ready")
    start.ready.wait(timeout=300)
    start_at_wall = start.at.value
    # perf_counter is per-process; convert the shared wall-clock start into it once.
    start_at = time.perf_counter() + (start_at_wall - time.time())
    out: list[Any] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()
    threads = [
        threading.Thread(
            target=_client_thread,
            args=(
                scenario,
                host,
                port,
                headers,
                i,
                params,
                start_at,
                warmup_s,
                window_s,
                out,
                errors,
                lock,
                stop,
            ),
            daemon=True,
        )
        for i in indexes
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    queue.put((out, errors, usage.ru_utime + usage.ru_stime))


@dataclass
class _Start:
    """When the client processes start: ``at`` (wall clock), valid once ``ready`` is set."""

    ready: Any
    at: Any


class LoadControl:
    """A load whose window the orchestrator ends (from another thread) instead of a fixed length:
    ``window_s`` is then only the longest it may last. ``wait_window`` blocks until the measured
    window has begun (the client processes spawned and warmed up), ``stop`` ends it; the result's
    ``window_s`` is the window's real length. For a figure measured *while* something else of
    unknown duration happens (a bulk decision)."""

    def __init__(self) -> None:
        ctx = mp.get_context("spawn")
        self.event = ctx.Event()
        # Wall-clock times (shared with the client processes): the window's start, the stop.
        self.window_at = ctx.Value("d", 0.0)
        self.stopped_at = ctx.Value("d", 0.0)

    def wait_window(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = self.window_at.value
            if at and time.time() >= at:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if not self.event.is_set():
            self.stopped_at.value = time.time()
            self.event.set()


def run_load(
    *,
    scenario: str,
    host: str,
    port: int,
    clients: int,
    processes: int,
    warmup_s: float,
    window_s: float,
    params: dict[str, Any],
    headers: dict[str, str] | None = None,
    control: LoadControl | None = None,
) -> LoadResult:
    processes = max(1, min(processes, clients))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    # Every process starts its clients at once, at a time set when all of them are ready.
    start = _Start(ready=ctx.Event(), at=ctx.Value("d", 0.0))
    groups = [list(range(p, clients, processes)) for p in range(processes)]
    procs = [
        ctx.Process(
            target=_process_main,
            args=(
                scenario,
                host,
                port,
                headers or {},
                group,
                params,
                start,
                warmup_s,
                window_s,
                queue,
                (control.event, control.stopped_at) if control is not None else None,
            ),
        )
        for group in groups
    ]
    for p in procs:
        p.start()
    for _ in procs:
        if queue.get(timeout=300) != "ready":
            raise RuntimeError("a load generator process answered before it was ready")
    start.at.value = time.time() + 0.2
    if control is not None:
        control.window_at.value = start.at.value + warmup_s
    start.ready.set()
    result = LoadResult(clients=clients, processes=processes, window_s=window_s)
    for _ in procs:
        result.add(*queue.get(timeout=warmup_s + window_s + 120))
    for p in procs:
        p.join(timeout=30)
    if control is not None and control.event.is_set():
        result.window_s = max(0.0, min(window_s, control.stopped_at.value - control.window_at.value))
    return result
