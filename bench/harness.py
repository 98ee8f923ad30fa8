"""What every phase runs on: the run's options and sizes, its results, the web and worker
processes it starts (the Procfile's lines, or a candidate's), and the load generator pointed at
them. The phases (one module each) take a ``Harness``; ``bench.run`` makes it and runs them."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import machine, procs
from bench.databases import fresh_database
from bench.environment import child_env, setup_django
from bench.loadgen import LoadControl, LoadResult, run_load
from bench.sizes import CLIENT_PROCESSES, FULL, SMOKE
from bench.stats import log

# Candidate workers (bench/candidate_worker.py): measured beside the Procfile's, never instead of it.
# (The engine itself now runs an unwind's steps back to back in one job, which the earlier
# "inline-advance" candidates approximated; what is left to compare is the worker class.)
CANDIDATES = {
    "simple": "python -m bench.candidate_worker",
}


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
        self.results: dict[str, Any] = {"sections": {}, "errors": [], "notes": []}
        self.env: dict[str, str] = {}

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
        self.wait_worker_registered(proc)
        return proc

    def wait_worker_registered(self, proc: procs.Proc, timeout: float = 60) -> None:
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

    # Before the phases: a fresh database, migrated, and the machine described -------------------

    def prepare(self) -> None:
        from django.core.management import call_command
        from redis import Redis

        log(f"fresh database {urlsplit(self.database_url).path.lstrip('/')}; Redis {self.redis_url}")
        fresh_database(self.database_url)
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
        self.results["machine"] = machine.describe(self.database_url, self.redis_url)
