"""``make bench``'s baselines phase: what this machine can do at best. L1 raw PostgreSQL inserts,
L2 a no-op WSGI app under the Procfile's web line (bench/noop_wsgi.py), L3 raw RQ no-op jobs on
the Procfile's worker (and on each candidate worker); every other figure is held against them."""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench import procs
from bench.harness import CANDIDATES
from bench.loadgen import LoadResult, Sample
from bench.sizes import CLIENT_COUNTS, CLIENT_PROCESSES
from bench.stats import log, summarize
from bench.tables import fmt, measured_row

if TYPE_CHECKING:
    from bench.harness import Harness

L1_TABLE = "bench_l1_action"

# Every column of a ledger action, with values the size of what the API writes.
_L1_INSERT = f"""
INSERT INTO {L1_TABLE} (
    id, tenant_id, run_id, seq, tool, target_type, target_id, args, idempotency_key, payload_hash, intent,
    risk, action_class, approval_mode, requires_approval, policy, compensation_strategy, compensation_tool,
    compensation_args, status, attempts, error, error_layer, warnings, created_at, updated_at
) VALUES (%s, %s, %s, %s, 'bench.update_record', 'record', %s, %s, %s, %s, %s,
          'low', 'internal_update', 'auto', false, %s, 'custom', 'bench.undo',
          %s, 'planned', 0, '', '', '[]', now(), now())
"""  # noqa: S608 - fixed table name


def l1_prepare(dsn: str) -> None:
    """A table shaped like ledger_action, with its indexes and constraints (not its foreign keys,
    which would need parent rows: a physical limit, not the app's)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {L1_TABLE}")
        conn.execute(f"CREATE TABLE {L1_TABLE} (LIKE ledger_action INCLUDING ALL)")


def _l1_thread(
    dsn: str,
    index: int,
    start_at: float,
    warmup_s: float,
    window_s: float,
    out: list[Any],
    errors: dict[str, int],
) -> None:
    import psycopg

    # Autocommit: each INSERT is its own transaction, committed (and fsynced, synchronous_commit
    # stays on) before the next starts — the cheapest durable single-row append there is.
    conn = psycopg.connect(dsn, autocommit=True)
    run_id = f"run_l1{index:02d}{uuid.uuid4().hex[:20]}"
    policy = json.dumps({"tool": "bench.update_record", "risk": "low", "approval": "auto"})
    window_start, window_end = start_at + warmup_s, start_at + warmup_s + window_s
    seq = 0
    while time.perf_counter() < start_at:
        time.sleep(0.001)
    with conn.cursor() as cur:
        while True:
            seq += 1
            params = (
                f"act_{uuid.uuid4().hex[:26]}",
                1,
                run_id,
                seq,
                f"{run_id}-{seq}",
                json.dumps({"field": "status", "value": "active", "n": seq}),
                f"{run_id}:{seq}",
                "0" * 64,
                json.dumps({"reasoning": "benchmark", "confidence": 0.9}),
                policy,
                json.dumps({"n": seq}),
            )
            t = time.perf_counter()
            try:
                cur.execute(_L1_INSERT, params)
                status = 201
            except psycopg.Error as exc:
                status = 500
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            now = time.perf_counter()
            if window_start <= t < window_end:
                out.append(("insert", t, now - t, status, None))
            if now >= window_end:
                break
    conn.close()


def _l1_process(
    dsn: str, indexes: list[int], start_at_wall: float, warmup_s: float, window_s: float, queue: Any
) -> None:
    start_at = time.perf_counter() + (start_at_wall - time.time())
    out: list[Any] = []
    errors: dict[str, int] = {}
    threads = [
        threading.Thread(target=_l1_thread, args=(dsn, i, start_at, warmup_s, window_s, out, errors))
        for i in indexes
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    queue.put((out, errors, usage.ru_utime + usage.ru_stime))


def l1_run(*, dsn: str, connections: int, processes: int, warmup_s: float, window_s: float) -> LoadResult:
    """Same process/thread shape as the HTTP load generator: ``processes`` processes, one thread
    (and one connection) per client."""
    processes = max(1, min(processes, connections))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at_wall = time.time() + 1.5
    groups = [list(range(p, connections, processes)) for p in range(processes)]
    procs = [
        ctx.Process(target=_l1_process, args=(dsn, g, start_at_wall, warmup_s, window_s, queue))
        for g in groups
    ]
    for p in procs:
        p.start()
    result = LoadResult(clients=connections, processes=processes, window_s=window_s)
    for _ in procs:
        out, errors, cpu = queue.get(timeout=warmup_s + window_s + 120)
        result.samples.extend(Sample(op, s, lat, st) for op, s, lat, st, _ in out)
        result.client_cpu_s += cpu
        for k, v in errors.items():
            result.errors[k] = result.errors.get(k, 0) + v
    for p in procs:
        p.join(timeout=30)
    return result


# --- L3: raw RQ -------------------------------------------------------------------------------


@dataclass
class RQResult:
    jobs: int
    seconds: float

    @property
    def per_job_ms(self) -> float:
        return self.seconds / self.jobs * 1000 if self.jobs else 0.0

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def l3_batch(*, redis_url: str, jobs: int, queue_name: str = "default", timeout_s: float = 300) -> RQResult:
    """Enqueue ``jobs`` no-op jobs at once and time until the worker(s) finished them all."""
    from redis import Redis
    from rq import Queue
    from rq.registry import FinishedJobRegistry

    from bench.jobs import noop

    redis = Redis.from_url(redis_url)
    queue = Queue(queue_name, connection=redis)
    registry = FinishedJobRegistry(queue=queue)
    before = registry.count
    started = time.perf_counter()
    queue.enqueue_many([Queue.prepare_data(noop, result_ttl=600) for _ in range(jobs)])
    deadline = time.monotonic() + timeout_s
    while registry.count - before < jobs:
        if time.monotonic() > deadline:
            raise RuntimeError(f"L3: only {registry.count - before}/{jobs} jobs finished in {timeout_s}s")
        time.sleep(0.005)
    return RQResult(jobs=jobs, seconds=time.perf_counter() - started)


def l3_chain(*, redis_url: str, length: int, queue_name: str = "default", timeout_s: float = 300) -> RQResult:
    """A chain of ``length`` no-op jobs, each enqueueing the next: strictly sequential work."""
    from redis import Redis
    from rq import Queue

    from bench.jobs import chain

    redis = Redis.from_url(redis_url)
    done_key = f"bench:chain:{uuid.uuid4().hex}"
    started_wall = time.time()
    Queue(queue_name, connection=redis).enqueue(chain, length, queue_name, done_key)
    deadline = time.monotonic() + timeout_s
    while (stamp := redis.get(done_key)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"L3 chain of {length} did not finish in {timeout_s}s")
        time.sleep(0.002)
    # The last job's own timestamp, so polling granularity does not count against RQ.
    return RQResult(jobs=length, seconds=float(stamp) - started_wall)


# --- The phase ------------------------------------------------------------------------------


def phase(h: Harness) -> None:
    """L1 at 1 and 16 connections, L2 at 1 and 16 clients, L3 batched and chained on each worker."""
    s = h.section("baselines")
    libpq_url = h.database_url
    l1_prepare(libpq_url)
    for n in CLIENT_COUNTS:
        log(f"L1 raw INSERT, {n} connection(s)")
        result = l1_run(
            dsn=libpq_url,
            connections=n,
            processes=min(CLIENT_PROCESSES, n),
            warmup_s=h.sizes.warmup_s,
            window_s=h.sizes.window_s,
        )
        s[f"L1_{n}"] = summarize(result)

    body = {
        "tool": "bench.update_record",
        "target_type": "record",
        "target_id": "r-1",
        "args": {"field": "status", "value": "active", "n": 1},
        "idempotency_key": "x" * 40,
        "intent": {"reasoning": "benchmark: set the record active", "confidence": 0.9},
        "compensation": {"tool": "bench.undo", "args": {"n": 1}},
    }
    web = h.start_web("l2-noop", app="bench.noop_wsgi:application", ready_path="/")
    try:
        for n in CLIENT_COUNTS:
            log(f"L2 no-op WSGI app under the Procfile's web line, {n} client(s)")
            result = h.load("post_json", n, {"path": "/api/v1/noop", "body": body}, web=web)
            s[f"L2_{n}"] = summarize(result)
    finally:
        web.stop()

    s["L3_worker_class"] = procs.worker_class_name(h.env)
    for candidate in (None, *CANDIDATES):
        suffix = "_candidate" if candidate else ""
        log(f"L3 raw RQ no-op jobs on the {candidate or 'Procfile'} worker")
        worker = h.start_worker(candidate)
        try:
            l3_batch(redis_url=h.redis_url, jobs=max(5, h.sizes.l3_jobs // 10))  # warm-up
            batch = l3_batch(redis_url=h.redis_url, jobs=h.sizes.l3_jobs)
            chain = l3_chain(redis_url=h.redis_url, length=h.sizes.l3_chain)
        finally:
            worker.stop()
        for key, r in ((f"L3_batch{suffix}", batch), (f"L3_chain{suffix}", chain)):
            s[key] = {
                "jobs": r.jobs,
                "seconds": r.seconds,
                "jobs_per_s": r.jobs_per_s,
                "per_job_ms": r.per_job_ms,
            }


# --- The report -----------------------------------------------------------------------------


def rows(base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for n in (1, 16):
        rows.append(measured_row(f"L1 raw INSERT ({n} conn)", base.get(f"L1_{n}")))
        rows.append(measured_row(f"L2 no-op WSGI ({n} clients)", base.get(f"L2_{n}")))
    for kind in ("L3_batch", "L3_chain", "L3_batch_candidate", "L3_chain_candidate"):
        entry = base.get(kind)
        if entry:
            how = "batch" if kind.startswith("L3_batch") else "chained"
            who = "candidate SimpleWorker" if kind.endswith("_candidate") else "Procfile worker"
            rows.append(
                [
                    f"L3 RQ no-op, {how} ({entry['jobs']} jobs, {who})",
                    "1 worker",
                    fmt(entry["jobs_per_s"]),
                    fmt(entry["per_job_ms"], 2) + " /job",
                    "–",
                    "–",
                    "0",
                    "–",
                ]
            )
    return rows


def markdown(base: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("L1_1", "L1_16", "L2_1", "L2_16"):
        e = base.get(key)
        if e:
            out.append(
                f"- {key}: {e['count']:,} requests in {e['window_s']:.0f} s, client CPU {e['client_cpu_s']:.1f} s, "
                f"errors {e['errors']} {e.get('error_detail') or ''}"
            )
    return out
