"""``make bench``: measure Saga Admin against this machine's own limits, all in one run.

    python -m bench.run                 # full size (100k runs x 10 actions, 10k open items)
    python -m bench.run --smoke         # tiny sizes, seconds: what `make test` runs

Phases, in order (each figure is measured in this run; nothing is carried over from another):
  1. baselines — L1 raw psycopg INSERTs, L2 a no-op WSGI app under the Procfile's web line, L3
     raw RQ no-op jobs on the Procfile's worker;
  2. ledger append over HTTP (the Procfile's web line), 1 and 16 clients, and again with traces
     off, on (exporting to a local OTLP sink) and off (bench/tracing.py); then refusals:
     what a POST without a valid key costs, tiny and 1 MiB (refused before the body is read);
     then a record with just under 1 MiB of args against a small one;
  3. dashboard at scale after ``seed_bench``: timings over HTTP, query counts at two data sizes,
     EXPLAIN (ANALYZE) of every query the pages run; then reads (bench/reads.py, issue 30): the
     agent's GETs against the append at 16 clients, the run page with 200 and 5,000 actions;
  4. unwind throughput with no-op Python compensators on the Procfile's worker;
  5. servers: the hot path (append, the framework floor, heartbeat, the full step; 16 clients) on
     the Procfile's web line and on each candidate server configuration (gunicorn sync/gthread,
     granian), one after another; the restated targets come from the Procfile's line;
  6. workers: 200 I/O-bound compensations (a 200 ms webhook) by 1, then 4 Procfile workers;
  7. bulk: 10k open items of one reason, the bulk preview of their filter, then a bulk that closes
     them all on one Procfile worker while 16 clients append (bench/bulk.py, issue 31);
  8. size: a year of history in its own database (10M actions, ~30M audit events by COPY), then
     the append, the pages and API lists, a governed tool call and retention at that size
     (bench/size.py, issue 30);
  9. soak: 8 agents record onboarding sagas for 90 s, a third failing, an operator compensating
     each through the API, the one Procfile worker SIGKILLed at 30 s and restarted, the soak's own
     Redis down 6 s at 55 s (bench/soak.py, issue 39).
It prints one table and writes docs/BENCHMARKS.md (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench import procs
from bench.loadgen import LoadControl, LoadResult, percentile, run_load

ROOT = procs.ROOT


@dataclass
class Sizes:
    window_s: float
    warmup_s: float
    l3_jobs: int
    l3_chain: int
    runs: int
    actions_per_run: int
    open_items: int
    pending_approvals: int
    resolved_items: int
    big_run_actions: int
    small_fraction: float
    page_samples: int
    deep_pages: int
    unwind_steps: int
    concurrent_unwinds: int
    scale_steps: int
    server_candidates: int | None
    bulk_items: int
    bulk_preview_samples: int
    # Items of the in-process profile of the decisions (bench/bulk.py ``profile``).
    bulk_profile_items: int
    # How long the bulk is expected to take (runs are made for the append over that long) and
    # how long it may (then it is reported as timed out).
    bulk_expected_s: float
    bulk_timeout_s: float
    # The "at size" phase (bench/size.py, issue 30 item 5): actions seeded (events ~3 per action),
    # open items, the run page's two sizes, chains verified, governed steps timed, runs per archive
    # batch and how long the rest of retention may take.
    size_actions: int = 10_000_000
    size_open_items: int = 2_000
    size_big_runs: tuple[int, ...] = (200, 5_000)
    verify_sample: int = 300
    governed_steps: int = 500
    archive_batch: int = 100_000
    archive_expected_s: float = 120
    retention_timeout_s: float = 3600


FULL = Sizes(
    window_s=15,
    warmup_s=3,
    l3_jobs=500,
    l3_chain=200,
    runs=100_000,
    actions_per_run=10,
    open_items=10_000,
    pending_approvals=1_000,
    resolved_items=5_000,
    big_run_actions=200,
    small_fraction=0.05,
    page_samples=40,
    deep_pages=40,
    unwind_steps=50,
    concurrent_unwinds=20,
    scale_steps=200,
    server_candidates=None,
    bulk_items=10_000,
    bulk_preview_samples=10,
    bulk_profile_items=300,
    bulk_expected_s=120,
    bulk_timeout_s=1200,
)
SMOKE = Sizes(
    window_s=1.0,
    warmup_s=0.3,
    l3_jobs=20,
    l3_chain=10,
    runs=300,
    actions_per_run=4,
    open_items=40,
    pending_approvals=10,
    resolved_items=10,
    big_run_actions=30,
    small_fraction=0.3,
    page_samples=3,
    deep_pages=2,
    unwind_steps=5,
    concurrent_unwinds=3,
    scale_steps=8,
    # One gthread and one granian line beside the Procfile's: proof that each server starts.
    server_candidates=2,
    bulk_items=200,
    bulk_preview_samples=3,
    bulk_profile_items=30,
    bulk_expected_s=10,
    bulk_timeout_s=240,
    size_actions=3_000,
    size_open_items=40,
    size_big_runs=(200, 500),
    verify_sample=20,
    governed_steps=20,
    archive_batch=50,
    archive_expected_s=5,
    retention_timeout_s=120,
)

CLIENT_COUNTS = (1, 16)
# The actions of one plan in the append phase's plan measurement (issue 30: "plans of 5").
PLAN_SIZE = 5
# Candidate workers (bench/candidate_worker.py): measured beside the Procfile's, never instead of it.
# (The engine itself now runs an unwind's steps back to back in one job, which the earlier
# "inline-advance" candidates approximated; what is left to compare is the worker class.)
CANDIDATES = {
    "simple": "python -m bench.candidate_worker",
}
CLIENT_PROCESSES = 4

# Web server configurations compared on the hot path (issue 19): whole web lines as the Procfile
# would carry them, each a sensible choice for this 2-core machine. A line equal to the Procfile's
# (after bash's expansion, in the same environment) is measured once, as the Procfile's.
# Neither keeps X-Forwarded-For as the client address: REMOTE_ADDR stays the peer, and the API
# believes forwarded addresses only as far as SAGA_TRUSTED_PROXY_HOPS says; the scheme comes from
# X-Forwarded-Proto through Django's SECURE_PROXY_SSL_HEADER whichever server runs.


def _gunicorn(options: str) -> str:
    return (
        f"gunicorn saga_admin.wsgi --bind 0.0.0.0:${{PORT:-8000}} {options} --access-logfile - "
        "--forwarded-allow-ips '*'"
    )


def _granian(options: str) -> str:
    return (
        f"granian --interface wsgi --host 0.0.0.0 --port ${{PORT:-8000}} {options} --access-log --no-ws "
        "saga_admin.wsgi:application"
    )


SERVERS: dict[str, str] = {
    "gunicorn sync, 3 workers": _gunicorn("--workers 3"),
    "gunicorn sync, 5 workers": _gunicorn("--workers 5"),
    "gunicorn gthread, 2 workers x 4 threads": _gunicorn("--workers 2 --worker-class gthread --threads 4"),
    "gunicorn gthread, 4 workers x 4 threads": _gunicorn("--workers 4 --worker-class gthread --threads 4"),
    "granian, 2 workers x 4 blocking threads": _granian("--workers 2 --blocking-threads 4"),
    "granian, 4 workers x 2 blocking threads": _granian("--workers 4 --blocking-threads 2"),
}
# Worker processes compared in the scale-out section, and the downstream delay of each call.
# Issue 39 asks 1, 2 and 4 worker processes measured (4 ≥ 3.5x 1 on I/O-bound steps).
SCALE_WORKERS = (1, 2, 4)
SCALE_DELAY_S = 0.2


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def summarize(result: LoadResult, op: str | None = None) -> dict[str, Any]:
    lat = result.latencies(op)
    return {
        "clients": result.clients,
        "count": result.count(op),
        "throughput": result.throughput(op),
        "p50_ms": percentile(lat, 50) * 1000,
        "p95_ms": percentile(lat, 95) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "errors": result.error_count(),
        "error_detail": dict(result.errors),
        "client_cpu_s": result.client_cpu_s,
        "server_cpu_ms_per_request": result.server_cpu_ms_per_request,
        "requests_total": result.requests_total,
        "window_s": result.window_s,
    }


# --- Environment ------------------------------------------------------------------------------


def _with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def fresh_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def claim_redis_db(base_url: str) -> tuple[str, Any]:
    """Smoke runs (inside `make test`, maybe several at once on one machine) claim a free Redis
    database among 8-15 with a key that expires, instead of sharing one."""
    from redis import Redis

    parts = urlsplit(base_url)
    for db in range(8, 16):
        url = urlunsplit(parts._replace(path=f"/{db}"))
        redis = Redis.from_url(url)
        if redis.set("saga-bench:claim", str(os.getpid()), nx=True, ex=1800):
            return url, redis
    raise RuntimeError("no free Redis database among 8-15 for the benchmark")


def child_env(*, database_url: str, redis_url: str, port: int, settings_module: str) -> dict[str, str]:
    env = dict(os.environ)
    # setup_django() sets DB_CONN_MAX_AGE=0 for this orchestrator only; inherited, it would make
    # every gunicorn request open (and PostgreSQL fork a backend for) a fresh connection, which is
    # not how the product is deployed (its settings keep connections for 60 s).
    env.pop("DB_CONN_MAX_AGE", None)
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "PORT": str(port),
            "DJANGO_SETTINGS_MODULE": settings_module,
            # Production mode, as deployed: DEBUG off (no query log kept in memory), TLS ends at a
            # proxy in front, so no SSL redirect and cookies usable over plain HTTP on loopback.
            "DEBUG": "0",
            "SECRET_KEY": env.get("SECRET_KEY") or "bench-only-secret-key-not-for-production-0123456789",
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "SECURE_SSL_REDIRECT": "0",
            "SESSION_COOKIE_SECURE": "0",
            "CSRF_COOKIE_SECURE": "0",
            # The limiter stays on (its cost is measured) with a ceiling the benchmark cannot hit:
            # the question is what the ledger can take, not where the default limit sits.
            "SAGA_THROTTLE_RATE": "10000000/m",
            "SAGA_THROTTLE_BYTES": "1000GiB/m",
            "SAGA_UNAUTHENTICATED_RATE": "10000000/m",
            # seed_bench writes running runs with fresh heartbeats; a sweeper must not turn them
            # into agent_lost items (and burn CPU doing it) while other figures are measured.
            "SAGA_HEARTBEAT_TIMEOUT_S": "86400",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def setup_django(env: dict[str, str]) -> None:
    for key in (
        "DATABASE_URL",
        "REDIS_URL",
        "DEBUG",
        "SECRET_KEY",
        "ALLOWED_HOSTS",
        "SECURE_SSL_REDIRECT",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SAGA_THROTTLE_RATE",
        "SAGA_THROTTLE_BYTES",
        "SAGA_UNAUTHENTICATED_RATE",
        "SAGA_HEARTBEAT_TIMEOUT_S",
    ):
        os.environ[key] = env[key]
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    # The orchestrator itself is not a request handler: keep its connections short-lived so a
    # DROP DATABASE at the end is not blocked by them.
    os.environ["DB_CONN_MAX_AGE"] = "0"
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


# --- Phases -----------------------------------------------------------------------------------


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes = SMOKE if args.smoke else FULL
        if args.runs is not None:
            self.sizes.runs = args.runs
        if args.actions_per_run is not None:
            self.sizes.actions_per_run = args.actions_per_run
        if args.open_items is not None:
            self.sizes.open_items = args.open_items
        if args.window is not None:
            self.sizes.window_s = args.window
        if args.bulk_items is not None:
            self.sizes.bulk_items = args.bulk_items
        if args.page_samples is not None:
            self.sizes.page_samples = args.page_samples
        if args.size_actions is not None:
            self.sizes.size_actions = args.size_actions
        if args.size_archive_batch is not None:
            self.sizes.archive_batch = args.size_archive_batch
        if args.size_retention_timeout is not None:
            self.sizes.retention_timeout_s = args.size_retention_timeout
        self.database_url = args.database_url
        self.redis_url = args.redis_url
        self.port = args.port
        self.log_dir = Path(args.log_dir)
        self.soak_sizes = soak_sizes(args)
        self.results: dict[str, Any] = {"sections": {}, "errors": [], "notes": []}
        self.env: dict[str, str] = {}
        self.worker: procs.Proc | None = None

    # Helpers -------------------------------------------------------------------------------

    def env_for(self, settings_module: str = "saga_admin.settings") -> dict[str, str]:
        return child_env(
            database_url=self.database_url,
            redis_url=self.redis_url,
            port=self.port,
            settings_module=settings_module,
        )

    def start_web(
        self,
        name: str,
        *,
        app: str | None = None,
        command: str | None = None,
        settings_module: str = "saga_admin.settings",
        ready_path: str = "/healthz",
        extra_env: dict[str, str] | None = None,
    ) -> procs.Proc:
        env = {**self.env_for(settings_module), **(extra_env or {})}
        proc = procs.start(name, command or procs.web_command(app=app), env, self.log_dir)
        procs.wait_http(self.port, ready_path, proc)
        # Django imports the URLconf and the API on each worker process's first request; on a busy
        # machine that took longer than a smoke run's whole window, and the first load measured
        # nothing. Concurrent requests on fresh connections reach every worker before the clock.
        procs.warm_http(self.port, "/api/v1/policies", proc, connections=8)
        return proc

    def start_worker(self, candidate: str | None = None) -> procs.Proc:
        # Candidates are comparisons only: the product's figures come from the Procfile worker.
        command = CANDIDATES[candidate] if candidate else procs.worker_command()
        name = f"worker-{candidate}" if candidate else "worker"
        proc = procs.start(name, command, self.env_for(), self.log_dir)
        self._wait_worker_registered(proc)
        return proc

    def _wait_worker_registered(self, proc: procs.Proc, timeout: float = 60) -> None:
        self._wait_workers_registered([proc], timeout)

    def _wait_workers_registered(self, started: list[procs.Proc], timeout: float = 60) -> None:
        from redis import Redis
        from rq import Worker

        redis = Redis.from_url(self.redis_url)
        pids = {p.popen.pid for p in started}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in started:
                if proc.popen.poll() is not None:
                    raise RuntimeError(f"worker exited with {proc.popen.returncode}; see {proc.log.name}")
            # bash execs the worker command, so the registered worker's pid is the one started.
            ready = {w.pid for w in Worker.all(connection=redis) if w.state in ("idle", "busy")}
            if pids <= ready:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{len(started)} RQ worker(s) did not all register within {timeout:.0f} s")

    def start_workers(self, count: int) -> list[procs.Proc]:
        """``count`` processes of the Procfile's worker line, returned once all are registered."""
        started = [
            procs.start(f"worker-scale{count}-{i}", procs.worker_command(), self.env_for(), self.log_dir)
            for i in range(count)
        ]
        try:
            self._wait_workers_registered(started, timeout=120)
        except Exception:
            for proc in started:
                proc.stop()
            raise
        return started

    def load(
        self,
        scenario: str,
        clients: int,
        params: dict[str, Any],
        headers: dict[str, str] | None = None,
        web: procs.Proc | None = None,
        window_s: float | None = None,
        control: LoadControl | None = None,
    ) -> LoadResult:
        """``window_s``: instead of the size's window; with ``control``, the longest the load may
        last (``control.stop()`` ends it, see ``LoadControl``)."""
        cpu_before = web.cpu_seconds() if web else 0.0
        result = run_load(
            scenario=scenario,
            host="127.0.0.1",
            port=self.port,
            clients=clients,
            processes=min(CLIENT_PROCESSES, clients),
            warmup_s=self.sizes.warmup_s,
            # One client on a busy machine: a smoke run's 1 s window could end before a cold worker
            # process answered the first request, and measure nothing; 3 s at least (a full run's
            # window is 15 s anyway).
            window_s=window_s or max(self.sizes.window_s, 3.0 if clients == 1 else 0.0),
            params=params,
            headers=headers,
            control=control,
        )
        if web is not None and result.requests_total:
            # The web processes' own CPU per request (warm-up on both sides of the division):
            # what the stack costs apart from PostgreSQL and the load generator.
            result.server_cpu_ms_per_request = (web.cpu_seconds() - cpu_before) / result.requests_total * 1000
        return result

    def section(self, name: str) -> dict[str, Any]:
        return self.results["sections"].setdefault(name, {})

    # Phase 0 ----------------------------------------------------------------------------------

    def prepare(self) -> None:
        from django.core.management import call_command

        log(f"fresh database {urlsplit(self.database_url).path.lstrip('/')}; Redis {self.redis_url}")
        fresh_database(self.database_url)
        from redis import Redis

        Redis.from_url(self.redis_url).flushdb()
        # The flush removed the claim on an auto-claimed database: put it back, or a concurrent run
        # claims the same database and its worker takes this run's jobs (and vice versa).
        if self.args.smoke or getattr(self.args, "redis_claimed", False):
            Redis.from_url(self.redis_url).set("saga-bench:claim", str(os.getpid()), ex=1800)
        self.env = self.env_for()
        setup_django(self.env)
        call_command("migrate", verbosity=0)
        # DEBUG=0 serves hashed static files from the manifest; pages need it to render.
        call_command("collectstatic", interactive=False, verbosity=0)
        from bench import machine

        self.results["machine"] = machine.describe(self.database_url, self.redis_url)

    # Phase 1 ----------------------------------------------------------------------------------

    def baselines(self) -> None:
        from bench import baselines

        s = self.section("baselines")
        libpq_url = self.database_url
        baselines.l1_prepare(libpq_url)
        for n in CLIENT_COUNTS:
            log(f"L1 raw INSERT, {n} connection(s)")
            result = baselines.l1_run(
                dsn=libpq_url,
                connections=n,
                processes=min(CLIENT_PROCESSES, n),
                warmup_s=self.sizes.warmup_s,
                window_s=self.sizes.window_s,
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
        web = self.start_web("l2-noop", app="bench.noop_wsgi:application", ready_path="/")
        try:
            for n in CLIENT_COUNTS:
                log(f"L2 no-op WSGI app under the Procfile's web line, {n} client(s)")
                result = self.load("post_json", n, {"path": "/api/v1/noop", "body": body}, web=web)
                s[f"L2_{n}"] = summarize(result)
        finally:
            web.stop()

        s["L3_worker_class"] = procs.worker_class_name(self.env)
        for candidate in (None, *CANDIDATES):
            suffix = "_candidate" if candidate else ""
            log(f"L3 raw RQ no-op jobs on the {candidate or 'Procfile'} worker")
            worker = self.start_worker(candidate)
            try:
                baselines.l3_batch(redis_url=self.redis_url, jobs=max(5, self.sizes.l3_jobs // 10))  # warm-up
                batch = baselines.l3_batch(redis_url=self.redis_url, jobs=self.sizes.l3_jobs)
                chain = baselines.l3_chain(redis_url=self.redis_url, length=self.sizes.l3_chain)
            finally:
                worker.stop()
            for key, r in ((f"L3_batch{suffix}", batch), (f"L3_chain{suffix}", chain)):
                s[key] = {
                    "jobs": r.jobs,
                    "seconds": r.seconds,
                    "jobs_per_s": r.jobs_per_s,
                    "per_job_ms": r.per_job_ms,
                }

    # Phase 2 ----------------------------------------------------------------------------------

    def append(self) -> None:
        from bench import fixtures

        s = self.section("append")
        max_clients = max(CLIENT_COUNTS)
        keys = fixtures.agent_keys(tenant_slug="bench", count=max_clients)
        fixtures.load_bench_policies(self.log_dir)
        l2 = self.section("baselines").get(f"L2_{max_clients}", {}).get("throughput", 2000)
        per_run = 10
        # Enough fresh runs that no client runs out at up to half the no-op app's rate (a client
        # that did run out would go on recording into its last run).
        runs_needed = int(l2 * 0.5 * (self.sizes.warmup_s + self.sizes.window_s) / per_run / max_clients) + 2
        web = self.start_web("web-append")
        try:
            for scenario in ("record_action", "action_lifecycle"):
                for n in CLIENT_COUNTS:
                    log(f"ledger append over HTTP: {scenario}, {n} client(s)")
                    runs = fixtures.fresh_runs(keys=keys[:n], per_client=runs_needed)
                    params = {
                        "runs": runs,
                        "per_run": per_run,
                        "headers_per_client": {
                            i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)
                        },
                    }
                    result = self.load(scenario, n, params, web=web)
                    entry = {op: summarize(result, op) for op in result.ops()}
                    for op_summary in entry.values():
                        op_summary["errors"] = result.error_count()
                    s[f"{scenario}_{n}"] = entry
            # The same append where the tool's policy has two limits (a count per agent, a sum
            # per tenant): what limits add to a record.
            n = max_clients
            log(f"ledger append over HTTP: record_action with two limits, {n} clients")
            runs = fixtures.fresh_runs(keys=keys[:n], per_client=runs_needed)
            params = {
                "runs": runs,
                "per_run": per_run,
                "tool": "bench.limited_update",
                "headers_per_client": {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)},
            }
            result = self.load("record_action", n, params, web=web)
            entry = {op: summarize(result, op) for op in result.ops()}
            for op_summary in entry.values():
                op_summary["errors"] = result.error_count()
            s[f"record_action_limited_{n}"] = entry
            # The same actions recorded through plans (POST /runs/{id}/plan, issue 30): the
            # request's cost paid once per PLAN_SIZE actions. Throughput counts plans; the actions
            # recorded per second are PLAN_SIZE times it, p99 is per request (per plan).
            log(f"ledger append over HTTP: record_plan of {PLAN_SIZE}, {n} clients")
            runs = fixtures.fresh_runs(keys=keys[:n], per_client=runs_needed)
            params = {
                "runs": runs,
                "per_run": per_run,
                "plan_size": PLAN_SIZE,
                "headers_per_client": {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)},
            }
            result = self.load("record_plan", n, params, web=web)
            entry = {op: summarize(result, op) for op in result.ops()}
            for op_summary in entry.values():
                op_summary["errors"] = result.error_count()
                op_summary["plan_size"] = PLAN_SIZE
                op_summary["actions_per_s"] = op_summary["throughput"] * PLAN_SIZE
            s[f"record_plan_{n}"] = entry
        finally:
            web.stop()

    def unauthenticated(self) -> None:
        """POSTs without a valid key, tiny and 1 MiB, against the Procfile's web line: the gate
        refuses them from the headers, so the megabyte must cost about what the tiny one does. The
        same megabyte with a valid key (read, parsed and checked, then a 422) is measured beside
        them: it is what every unauthenticated megabyte cost before the key came first."""
        from bench import fixtures

        s = self.section("unauthenticated")
        (_, secret), *_ = fixtures.agent_keys(tenant_slug="bench-refusals", count=1)
        unknown = "sk_0123456789ab_" + "x" * 43
        cases = [
            ("tiny_no_key", "tiny", {}, 401),
            ("megabyte_no_key", "megabyte", {}, 401),
            ("tiny_unknown_key", "tiny", {"Authorization": f"Bearer {unknown}"}, 401),
            ("megabyte_unknown_key", "megabyte", {"Authorization": f"Bearer {unknown}"}, 401),
            ("megabyte_valid_key", "megabyte", {"Authorization": f"Bearer {secret}"}, 422),
        ]
        web = self.start_web("web-unauthenticated")
        try:
            for name, body, headers, expected in cases:
                log(f"refusals: {name}, 1 client")
                params = {
                    "op": name,
                    "path": "/api/v1/runs",
                    "body": body,
                    "headers": headers,
                    "expected": expected,
                }
                s[name] = summarize(self.load("post_raw", 1, params, web=web), name)
        finally:
            web.stop()

    def audit_stream(self) -> None:
        from bench import audit_stream

        audit_stream.measure(self)

    def record_size(self) -> None:
        """A record with just under 1 MiB of args against a small one, one client each, on the
        Procfile's web line (issue 26, point 8): what a valid key's megabyte costs the server,
        parsed, hashed, stored and echoed back; for a tool that needs no approval and for one that
        waits for a person (its approval binds and stores the args too). The per-key byte budget is set out of reach here,
        as the request rate is."""
        from bench import fixtures

        s = self.section("record_size")
        (key_id, secret), *_ = fixtures.agent_keys(tenant_slug="bench-record-size", count=1)
        fixtures.load_bench_policies(self.log_dir)
        web = self.start_web("web-record-size")
        try:
            for name, megabyte, tool in (
                ("small", False, None),
                ("megabyte", True, None),
                # No policy names it: the default policy's approval is opened for each record.
                ("small_gated", False, "unlisted.needs_a_person"),
                ("megabyte_gated", True, "unlisted.needs_a_person"),
            ):
                log(f"record size: {name} args, 1 client")
                params = {
                    **({"tool": tool} if tool else {}),
                    "runs": fixtures.fresh_runs(keys=[(key_id, secret)], per_client=200),
                    "per_run": 10,
                    "megabyte": megabyte,
                    "op": name,
                    "headers_per_client": {0: {"Authorization": f"Bearer {secret}"}},
                }
                s[name] = summarize(self.load("record_action", 1, params, web=web), name)
        finally:
            web.stop()

    # Phase 3 ----------------------------------------------------------------------------------

    def dashboard(self) -> None:
        from bench import dashboard

        s = self.section("dashboard")
        sizes = self.sizes
        small_runs = max(10, int(sizes.runs * sizes.small_fraction))
        ratio = small_runs / sizes.runs
        seed_small = dict(
            runs=small_runs,
            actions_per_run=sizes.actions_per_run,
            open_items=max(5, int(sizes.open_items * ratio)),
            pending_approvals=max(2, int(sizes.pending_approvals * ratio)),
            resolved_items=max(2, int(sizes.resolved_items * ratio)),
            big_run_actions=sizes.big_run_actions,
        )
        seed_rest = dict(
            runs=sizes.runs - small_runs,
            actions_per_run=sizes.actions_per_run,
            open_items=sizes.open_items - seed_small["open_items"],
            pending_approvals=sizes.pending_approvals - seed_small["pending_approvals"],
            resolved_items=sizes.resolved_items - seed_small["resolved_items"],
            big_run_actions=sizes.big_run_actions,
        )
        user = dashboard.operator()
        log(f"seed_bench (small): {seed_small}")
        s["seed_small"] = dashboard.seed(seed_small)
        pages_small = dashboard.pages(
            user=user, deep_pages=sizes.deep_pages, big_run_actions=sizes.big_run_actions
        )
        s["queries_small"] = dashboard.query_counts(user=user, pages=pages_small)
        log(f"seed_bench (rest): {seed_rest}")
        s["seed_full"] = dashboard.seed(seed_rest)
        s["data"] = dashboard.table_sizes()
        pages_full = dashboard.pages(
            user=user, deep_pages=sizes.deep_pages, big_run_actions=sizes.big_run_actions
        )
        s["pages"] = {name: path for name, path in pages_full}
        s["queries_full"] = dashboard.query_counts(user=user, pages=pages_full)
        log("EXPLAIN ANALYZE of every query the pages run")
        s["explain"] = dashboard.explain_pages(user=user, pages=pages_full)
        # Before/after for the indexes this harness's findings added (same data, same run).
        s["explain_without_bench_indexes"] = dashboard.explain_pages(
            user=user, pages=pages_full, without=dashboard.BENCH_INDEXES
        )
        cookie = dashboard.session_cookie(user)
        web = self.start_web("web-dashboard", settings_module="bench.settings")
        try:
            log("dashboard pages over HTTP, 1 client")
            timings: dict[str, Any] = {}
            for name, path in pages_full:
                result = run_load(
                    scenario="get_pages",
                    host="127.0.0.1",
                    port=self.port,
                    clients=1,
                    processes=1,
                    warmup_s=0,
                    window_s=3600,
                    params={"pages": [(name, path)], "max_requests_per_client": sizes.page_samples + 2},
                    headers={"Cookie": cookie},
                )
                lat = result.latencies(name)[:]
                # The first two requests warm the worker's caches (templates, connection); drop
                # them by start time, not by speed.
                ordered = sorted((x for x in result.samples if x.op == name), key=lambda x: x.started)[2:]
                lat = sorted(x.latency for x in ordered)
                timings[name] = {
                    "count": len(lat),
                    "p50_ms": percentile(lat, 50) * 1000,
                    "p95_ms": percentile(lat, 95) * 1000,
                    "errors": result.error_count(),
                    "error_detail": dict(result.errors),
                    "http_queries": sorted(result.queries.get(name, set())),
                }
            s["timings"] = timings
        finally:
            web.stop()

    # Phase 3b: reads against the append, and the run page by the ledger's length -------------

    def reads(self) -> None:
        from bench import reads

        self.section("reads").update(reads.measure(self, summarize, log))

    # Phase 4 ----------------------------------------------------------------------------------

    def unwinds(self) -> None:
        from bench import unwinds

        s = self.section("unwind")
        candidates = list(CANDIDATES)
        for candidate in (None, *candidates):
            log(
                f"unwinds on the {candidate or 'Procfile'} worker: 1 x {self.sizes.unwind_steps} steps, "
                f"then {self.sizes.concurrent_unwinds} concurrent"
            )
            worker = self.start_worker(candidate)
            try:
                measured = unwinds.measure(
                    steps=self.sizes.unwind_steps,
                    concurrent=self.sizes.concurrent_unwinds,
                    log_dir=self.log_dir,
                )
            finally:
                worker.stop()
            if candidate:
                s.setdefault("candidates", {})[candidate] = measured
            else:
                s.update(measured)

    # Phase 2b: the append with traces off, on and off again (bench/tracing.py) ----------------

    def traces(self) -> None:
        from bench import tracing

        self.section("traces").update(tracing.measure(self, summarize, log))

    # Phase 5 ----------------------------------------------------------------------------------

    def hot_path(self, web: procs.Proc, keys: list[tuple[str, str]]) -> dict[str, Any]:
        """The four figures of issue 19 at 16 clients on one running web server: append (record
        an action), the framework floor (GET a run's checkpoints), heartbeat, the full step
        (record with ``start: true`` → succeed)."""
        from bench import fixtures

        n = len(keys)
        per_run = 10
        headers = {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)}
        # Fresh runs for up to 800 appends/s (a client that runs out records into its last run).
        runs_needed = int(800 * (self.sizes.warmup_s + self.sizes.window_s) / per_run / n) + 2
        out: dict[str, Any] = {}
        runs = fixtures.fresh_runs(keys=keys, per_client=runs_needed)
        params = {"runs": runs, "per_run": per_run, "headers_per_client": headers}
        out["append"] = summarize(self.load("record_action", n, params, web=web), "record_action")
        floor_runs = fixtures.runs_with_checkpoint(keys=keys)
        params = {"runs": floor_runs, "headers_per_client": headers}
        out["floor"] = summarize(self.load("get_checkpoints", n, params, web=web), "checkpoints")
        out["heartbeat"] = summarize(self.load("heartbeat", n, params, web=web), "heartbeat")
        runs = fixtures.fresh_runs(keys=keys, per_client=runs_needed)
        params = {"runs": runs, "per_run": per_run, "headers_per_client": headers}
        result = self.load("full_step", n, params, web=web)
        out["full_step"] = {op: summarize(result, op) for op in ("step", "record_start", "succeed")}
        return out

    def servers(self) -> None:
        from bench import fixtures

        s = self.section("servers")
        keys = fixtures.agent_keys(tenant_slug="bench-servers", count=max(CLIENT_COUNTS))
        fixtures.load_bench_policies(self.log_dir)
        env = self.env_for()
        procfile = procs.web_command()
        procfile_argv = procs.expand(procfile, env)
        configs: list[tuple[str, str]] = [("Procfile", procfile)]
        for name, command in SERVERS.items():
            if procs.expand(command, env) == procfile_argv:
                s["procfile_is"] = name
            else:
                configs.append((name, command))
        if self.sizes.server_candidates is not None:
            gthread = [c for c in configs[1:] if "gthread" in c[1]][:1]
            granian = [c for c in configs[1:] if c[1].startswith("granian")][:1]
            configs = [configs[0], *gthread, *granian][: 1 + self.sizes.server_candidates]
        s["procfile"] = procfile
        measured = s.setdefault("configs", {})
        for i, (name, command) in enumerate(configs):
            log(f"servers: {name}: append, floor, heartbeat, full step; {len(keys)} clients")
            web = self.start_web(f"web-server-{i}", command=command)
            try:
                measured[name] = {"command": command, **self.hot_path(web, keys)}
            finally:
                web.stop()

    # Phase 6 ----------------------------------------------------------------------------------

    def workers(self) -> None:
        from bench import scale

        log(
            f"workers: {self.sizes.scale_steps} webhook compensations of {SCALE_DELAY_S * 1000:.0f} ms "
            f"by {' then '.join(map(str, SCALE_WORKERS))} Procfile worker process(es)"
        )
        self.section("workers").update(
            scale.measure(
                steps=self.sizes.scale_steps,
                worker_counts=SCALE_WORKERS,
                delay_s=SCALE_DELAY_S,
                log_dir=self.log_dir,
                start_workers=self.start_workers,
            )
        )
        # The same steps against a receiver that answers at once: one worker's compensation
        # throughput on no-op webhook steps, to hold against RQ's in-process no-op job rate (the
        # unwind phase's L3 on the SimpleWorker candidate; issue 39's target is at least half).
        log(f"workers: {self.sizes.scale_steps} no-op webhook compensations by 1 Procfile worker process")
        self.section("workers")["noop"] = scale.measure(
            steps=self.sizes.scale_steps,
            worker_counts=(1,),
            delay_s=0.0,
            log_dir=self.log_dir,
            start_workers=self.start_workers,
        )

    # Phase 7 ----------------------------------------------------------------------------------

    def bulk(self) -> None:
        from bench import bulk

        self.section("bulk").update(bulk.measure(self, summarize, log))

    def archive(self) -> None:
        from bench import archive

        self.section("archive").update(archive.measure_archive(self, summarize, log))

    # Phase 8 ----------------------------------------------------------------------------------

    def size(self) -> None:
        from bench import size

        self.section("size").update(size.measure(self, summarize, log))

    # Phase 9 ----------------------------------------------------------------------------------

    def soak(self) -> None:
        from bench import soak

        self.section("soak").update(soak.measure(self, summarize, log))

    # Driver -----------------------------------------------------------------------------------

    def run(self) -> int:
        from bench import machine

        started = time.monotonic()
        self.prepare()
        phases = [
            ("baselines", self.baselines),
            ("append", self.append),
            ("traces", self.traces),
            ("unauthenticated", self.unauthenticated),
            ("record_size", self.record_size),
            ("audit_stream", self.audit_stream),
            ("dashboard", self.dashboard),
            ("reads", self.reads),
            ("unwind", self.unwinds),
            ("servers", self.servers),
            ("workers", self.workers),
            ("bulk", self.bulk),
            ("archive", self.archive),
            ("size", self.size),
            ("soak", self.soak),
        ]
        only = set(self.args.only.split(",")) if self.args.only else None
        for name, phase in phases:
            if only and name not in only:
                continue
            self.results.setdefault("load", {})[name] = machine.loadavg()
            try:
                phase()
            except Exception as exc:  # noqa: BLE001 - a phase that cannot run is reported, not hidden
                log(f"phase {name} failed: {exc!r}")
                self.results["errors"].append(
                    {"phase": name, "error": repr(exc), "traceback": traceback.format_exc()}
                )
        self.results["elapsed_s"] = time.monotonic() - started
        self.results["smoke"] = self.args.smoke
        # The lines measured, kept with the figures (the Procfile may change after a run).
        self.results["procfile"] = procs.procfile_lines()
        from bench import report

        self.results["load_after"] = machine.loadavg()
        # The figures first: a report that fails to render can be rendered again (--render).
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "results.json").write_text(json.dumps(self.results, indent=2, default=str))
        text, markdown = report.render(self.results, smoke=self.args.smoke)
        print(text)
        out = Path(self.args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown)
        log(f"wrote {out} and {self.log_dir / 'results.json'}")
        return 1 if self.results["errors"] else 0


def soak_options(parser: argparse.ArgumentParser) -> None:
    """The soak's knobs (issue 39); unset, the size's (full: 90 s, 8 agents, kill at 30 s, Redis
    down 6 s at 55 s; --smoke: seconds)."""
    group = parser.add_argument_group("soak (issue 39)")
    group.add_argument("--soak-duration", type=float, default=None, help="seconds of load")
    group.add_argument("--soak-agents", type=int, default=None, help="agents recording sagas")
    group.add_argument(
        "--soak-kill-at", type=float, default=None, help="SIGKILL the worker this long in (<0: never)"
    )
    group.add_argument(
        "--soak-outage-at", type=float, default=None, help="stop Redis this long in (<0: never)"
    )
    group.add_argument("--soak-outage", type=float, default=None, help="seconds Redis stays down")
    group.add_argument(
        "--soak-observe",
        type=float,
        default=None,
        help="seconds to keep watching after the load (not a target)",
    )


def soak_sizes(args: argparse.Namespace) -> Any:
    from bench import soak

    base = soak.SMOKE if args.smoke else soak.FULL
    overrides = {
        "duration_s": args.soak_duration,
        "agents": args.soak_agents,
        "kill_at_s": args.soak_kill_at,
        "outage_at_s": args.soak_outage_at,
        "outage_s": args.soak_outage,
        "observe_s": args.soak_observe,
    }
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (a caller's timeout, a CI job cancelled) unwinds like an error: every phase's
    ``finally`` stops the processes it started and the database is dropped. Killed outright, the
    web servers, workers and redis-servers the phases start in sessions of their own live on."""
    del frame
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check that the harness works")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/saga_bench"),
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/6"),
        help="'auto' claims a free database among 8-15",
    )
    parser.add_argument("--port", type=int, default=int(os.environ.get("BENCH_PORT", "18731")))
    parser.add_argument("--out", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    parser.add_argument("--log-dir", default=str(ROOT / "artifacts" / "bench"))
    parser.add_argument(
        "--keep-db", action="store_true", help="do not drop the benchmark database at the end"
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated phases: baselines,append,traces,unauthenticated,record_size,audit_stream,"
        "dashboard,reads,unwind,servers,workers,bulk,archive,size,soak",
    )
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--actions-per-run", type=int, default=None)
    parser.add_argument("--open-items", type=int, default=None)
    parser.add_argument("--window", type=float, default=None, help="seconds measured per load test")
    parser.add_argument("--bulk-items", type=int, default=None, help="open items the bulk phase closes")
    parser.add_argument(
        "--bulk-workers",
        type=int,
        default=4,
        help="Procfile workers the bulk phase decides on (its lanes share them)",
    )
    parser.add_argument(
        "--archive-runs", type=int, default=2000, help="closed runs the archive phase seeds and archives"
    )
    parser.add_argument("--page-samples", type=int, default=None, help="timed fetches of each dashboard page")
    parser.add_argument(
        "--size-actions",
        type=int,
        default=None,
        help="actions the 'size' phase seeds (default 10,000,000; ~3 audit events each)",
    )
    parser.add_argument(
        "--size-reuse",
        action="store_true",
        help="measure the size database a --keep-db run seeded (its log dir's size-seed.json) again, unseeded",
    )
    parser.add_argument("--size-workers", type=int, default=2, help="parallel COPY streams of the size seed")
    parser.add_argument(
        "--size-archive-batch",
        type=int,
        default=None,
        help="runs in the archive batch timed under the append (default 100,000), and per later pass",
    )
    parser.add_argument(
        "--size-retention-timeout",
        type=float,
        default=None,
        help="seconds the rest of retention may take after the timed batch (default 3600)",
    )
    parser.add_argument(
        "--size-database-url",
        default=os.environ.get("BENCH_SIZE_DATABASE_URL", ""),
        help="the size phase's own database (default: --database-url's name + '_size'; dropped unless --keep-db)",
    )
    soak_options(parser)
    parser.add_argument(
        "--render",
        metavar="RESULTS_JSON",
        default="",
        help="only re-render the report (e.g. after editing bench/findings.md) from a run's results",
    )
    args = parser.parse_args(argv)
    if args.render:
        from bench import report

        results = json.loads(Path(args.render).read_text())
        text, markdown = report.render(results, smoke=bool(results.get("smoke")))
        print(text)
        Path(args.out).write_text(markdown)
        return 0
    claim = None
    if args.redis_url == "auto":
        args.redis_url, claim = claim_redis_db("redis://127.0.0.1:6379/0")
        args.redis_claimed = True
    harness = Harness(args)
    try:
        return harness.run()
    finally:
        if claim is not None:
            claim.flushdb()
        if not args.keep_db:
            try:
                from django.db import connections

                connections.close_all()
            except Exception:  # noqa: BLE001, S110 - Django may never have been set up
                pass
            drop_database(args.database_url)


if __name__ == "__main__":
    sys.exit(main())
