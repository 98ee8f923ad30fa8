"""Where a one-step unwind's time goes: the workers phase's no-op webhook steps, profiled.

The workers phase measures one Procfile worker carrying out one-step unwinds whose compensator is
a webhook that answers at once, and holds that rate against RQ's in-process no-op job. This runs
the same work in this process so that it can be taken apart: ``--steps`` failed one-step runs (the
phase's own ``bench.unwinds.failed_run``), their unwinds started in one transaction as the phase
starts them, then each unwind's job (``recovery.jobs.unwind_advance``, what the worker runs)
called directly under ``cProfile`` and a statement counter, and beside it RQ's no-op job
performed in process by a ``SimpleWorker`` (``--burst``) on the same machine.

    BENCH_DATABASE_URL=postgres://…/saga_bench_profile REDIS_URL=redis://…/13 \\
        python -m bench.unwind_profile [--steps 200] [--top 25]

A fresh database, dropped at the end. Prints JSON, then markdown: per step wall, CPU, statements
and their time, the statements by kind, and the functions with the most cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import statistics
import time
from collections import Counter
from typing import Any

from bench.databases import drop_database, fresh_database
from bench.environment import child_env, setup_django


def _statement_kind(sql: str) -> str:
    head = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    if head in ("SELECT", "WITH"):
        table = re.search(r'FROM\s+"?([a-z_]+)"?', sql)
        locked = " FOR UPDATE" if "FOR UPDATE" in sql else ""
        return f"SELECT {table.group(1) if table else '?'}{locked}"
    if head in ("INSERT", "UPDATE", "DELETE"):
        table = re.search(r'(?:INTO|UPDATE|FROM)\s+"?([a-z_]+)"?', sql)
        return f"{head} {table.group(1) if table else '?'}"
    return head


class _Statements:
    """Every statement the connection runs, by kind, and the time spent waiting on them (an
    ``execute_wrapper``: Django's query log stops at 9,000 entries, fewer than a batch runs)."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.seconds = 0.0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.kinds[_statement_kind(sql)] += 1


def _rq_noop_in_process(redis_url: str, jobs: int) -> dict[str, float]:
    """RQ's own floor in this process: ``jobs`` no-op jobs enqueued, then one SimpleWorker burst."""
    from redis import Redis
    from rq import Queue, SimpleWorker

    redis = Redis.from_url(redis_url)
    queue = Queue("bench-profile-noop", connection=redis)
    queue.empty()
    for _ in range(jobs):
        queue.enqueue("bench.jobs.noop", result_ttl=0)
    worker = SimpleWorker([queue], connection=redis)
    started = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    seconds = time.perf_counter() - started
    queue.empty()
    return {"jobs": jobs, "seconds": seconds, "per_job_ms": seconds / jobs * 1000, "per_s": jobs / seconds}


# What the worker's main thread was doing, by the frames that name it (py-spy's raw stacks).
_MAIN_THREAD_FRAMES = (
    ("dequeue_job_and_maintain_ttl", "waiting for the next job (Redis BLPOP; idle included)"),
    ("job_calls_code_in_process", "judging whether the job forks (the unwind's compensator rows)"),
    ("unwind_advance (runner.py)", "the unwind's job (recovery.unwinds.runner.unwind_advance)"),
    ("wait (connection.py)", "  of it, waiting on PostgreSQL (psycopg)"),
    ("audit_record (audit.py)", "  of it, audit events (INSERT + the run's chain head)"),
    ("unwind_finish (finish.py)", "  of it, finishing the unwind (item, run, announcements)"),
    ("compensators.py", "  of it, the compensator's call (httpx, signing)"),
    ("handle_job_success", "RQ's bookkeeping after the job"),
)


def _spy_summary(raw: str) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks of the worker's main thread (the one in ``BaseWorker.work``,
    not RQ's scheduler process forked from it), as the share of its samples each part is on."""
    total = 0
    shares: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or "BaseWorker.work" not in stack or "_start_scheduler" in stack:
            continue
        total += int(count)
        frames = {
            f"{frame.split(' (')[0]} ({frame.split('(', 1)[1].split(':')[0].rsplit('/', 1)[-1]})"
            for frame in stack.split(";")
            if "(" in frame
        }
        for key, _label in _MAIN_THREAD_FRAMES:
            if any(key in frame for frame in frames):
                shares[key] += int(count)
    return {
        "main_thread_samples": total,
        "parts": [
            {"part": label, "frame": key, "share": shares[key] / total if total else 0.0}
            for key, label in _MAIN_THREAD_FRAMES
        ],
    }


def measure_worker(
    *, steps: int, top: int, env: dict[str, str], redis_url: str, log_dir: str
) -> dict[str, Any]:
    """The same unwinds carried out by one real process of the Procfile's worker line, sampled by
    py-spy (``--idle``: waiting counts too) from the commit that queues them to the last one done."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from django.db import transaction
    from redis import Redis
    from rq import Worker

    from bench import fixtures, procs
    from bench.scale import TOOL, serve
    from bench.unwinds import TENANT, failed_run, operator, start_unwind, wait_finished
    from recovery.models import UnwindStep

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    worker = procs.start("unwind-profile-worker", procs.worker_command(), env, Path(log_dir))
    try:
        redis = Redis.from_url(redis_url)
        deadline = time.monotonic() + 120
        while worker.popen.pid not in {w.pid for w in Worker.all(connection=redis)}:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker did not register within 120 s")
            time.sleep(0.2)
        with serve(0.0) as receiver:
            fixtures.load_bench_policies(
                Path(log_dir),
                compensators={
                    TOOL: {"webhook": f"http://127.0.0.1:{receiver.port}/undo", "secret": receiver.secret}
                },
            )
            fixtures.agent_keys(tenant_slug=TENANT, count=1)
            user = operator()
            warm = [failed_run(steps=1, index=i, compensation_tool=TOOL, label="wwarm") for i in range(5)]
            wait_finished([start_unwind(item, user).pk for _, item in warm], 120)
            runs = [
                failed_run(steps=1, index=i, compensation_tool=TOOL, label="worker") for i in range(steps)
            ]
            cpu_before = worker.cpu_seconds()
            raw = Path(log_dir) / "unwind-profile-worker.spy"
            sampler = subprocess.Popen(  # noqa: S603 - py-spy from this venv, on our own child
                [
                    spy,
                    "record",
                    "--idle",
                    "--subprocesses",
                    "-r",
                    "200",
                    "-f",
                    "raw",
                    "-o",
                    str(raw),
                    "-p",
                    str(worker.popen.pid),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attached
            with transaction.atomic():
                ids = [start_unwind(item, user).pk for _, item in runs]
                started = time.time()
            done = wait_finished(ids, 60 + steps)
            ends = [
                d["finished_at"].timestamp() if d["finished_at"] else d["observed"] for d in done.values()
            ]
            elapsed = max(ends) - started
            cpu = worker.cpu_seconds() - cpu_before
            sampler.send_signal(2)
            sampler.wait(timeout=60)
        statuses = Counter(UnwindStep.objects.filter(unwind_id__in=ids).values_list("status", flat=True))
        spied = _spy_summary(raw.read_text() if raw.exists() else "")
    finally:
        worker.stop()
    return {
        "steps": steps,
        "seconds": elapsed,
        "per_step_ms": elapsed / steps * 1000,
        "worker_cpu_ms_per_step": cpu / steps * 1000,
        "step_statuses": dict(statuses),
        "receiver_calls": receiver.calls,
        "py_spy": spied,
    }


def measure(*, steps: int, top: int, redis_url: str, log_dir: str) -> dict[str, Any]:
    from pathlib import Path

    from django.db import connection, transaction
    from redis import Redis

    from bench import fixtures
    from bench.scale import TOOL, serve
    from bench.unwinds import TENANT, failed_run, operator, start_unwind
    from recovery import jobs
    from recovery.models import UnwindStep

    with serve(0.0) as receiver:
        fixtures.load_bench_policies(
            Path(log_dir),
            compensators={
                TOOL: {"webhook": f"http://127.0.0.1:{receiver.port}/undo", "secret": receiver.secret}
            },
        )
        fixtures.agent_keys(tenant_slug=TENANT, count=1)
        user = operator()

        def started_unwinds(count: int, label: str) -> list[str]:
            runs = [failed_run(steps=1, index=i, compensation_tool=TOOL, label=label) for i in range(count)]
            with transaction.atomic():
                ids = [start_unwind(item, user).pk for _, item in runs]
            # The jobs the commit queued are this process's to run: nobody else serves the queue.
            Redis.from_url(redis_url).flushdb()
            return ids

        # Warm: imports, the policy cache, the first connections, the receiver's thread.
        for pk in started_unwinds(5, "warm"):
            jobs.unwind_advance(unwind_id=pk)
        ids = started_unwinds(steps, "profiled")

        # Timed without the profiler first (its own overhead inflates the small calls), then again
        # on a second batch with it, for the shape.
        wall: list[float] = []
        cpu: list[float] = []
        counter = _Statements()
        with connection.execute_wrapper(counter):
            for pk in ids:
                t0, c0 = time.perf_counter(), time.process_time()
                jobs.unwind_advance(unwind_id=pk)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
        sql_ms = counter.seconds * 1000
        kinds = counter.kinds
        statuses = Counter(UnwindStep.objects.filter(unwind_id__in=ids).values_list("status", flat=True))

        profiled = started_unwinds(steps, "cprofile")
        profile = cProfile.Profile()
        profile.enable()
        for pk in profiled:
            jobs.unwind_advance(unwind_id=pk)
        profile.disable()

    stream = io.StringIO()
    stats = pstats.Stats(profile, stream=stream)
    stats.sort_stats("cumulative")
    cumulative = []
    for func, (_cc, ncalls, tottime, cumtime, _callers) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][3],
        reverse=True,
    )[: top * 3]:
        filename, line, name = func
        short = filename.split("site-packages/")[-1].split("/work/main/")[-1]
        cumulative.append(
            {
                "function": f"{short}:{line} {name}",
                "calls_per_step": ncalls / steps,
                "own_ms_per_step": tottime / steps * 1000,
                "cumulative_ms_per_step": cumtime / steps * 1000,
            }
        )
    total_wall = sum(wall)
    return {
        "steps": steps,
        "step_statuses": dict(statuses),
        "per_step_ms": total_wall / steps * 1000,
        "per_step_median_ms": statistics.median(wall) * 1000,
        "per_step_p95_ms": sorted(wall)[int(0.95 * (len(wall) - 1))] * 1000,
        "per_step_cpu_ms": sum(cpu) / steps * 1000,
        "statements_per_step": sum(kinds.values()) / steps,
        "sql_ms_per_step": sql_ms / steps,
        "statement_kinds_per_step": {k: round(v / steps, 2) for k, v in kinds.most_common()},
        "receiver_calls": receiver.calls,
        "top_cumulative": cumulative[:top],
        "rq_noop_in_process": _rq_noop_in_process(redis_url, max(steps, 200)),
    }


def markdown(out: dict[str, Any]) -> list[str]:
    rq = out["rq_noop_in_process"]
    ratio = (1000 / out["per_step_ms"]) / rq["per_s"]
    lines = [
        f"{out['steps']} one-step unwinds (no-op webhook), `recovery.jobs.unwind_advance` called in process: "
        f"**{out['per_step_ms']:.1f} ms a step** (median {out['per_step_median_ms']:.1f}, p95 "
        f"{out['per_step_p95_ms']:.1f}), {out['per_step_cpu_ms']:.1f} ms of it this process's CPU; "
        f"**{out['statements_per_step']:.1f} statements** a step through the cursor (savepoints included; "
        "BEGIN and COMMIT are the connection's, not counted), "
        f"{out['sql_ms_per_step']:.1f} ms waiting on them. "
        f"RQ's no-op job performed in process (SimpleWorker burst, {rq['jobs']} jobs): {rq['per_job_ms']:.2f} ms "
        f"a job ({rq['per_s']:.0f}/s). Steps per second ÷ that rate: **{ratio:.2f}** (target ≥ 0.5).",
        "",
        "| statements a step, by kind | count |",
        "|---|---|",
        *[f"| `{k}` | {v} |" for k, v in out["statement_kinds_per_step"].items()],
        "",
        "| function (cProfile, cumulative) | calls a step | own ms a step | cumulative ms a step |",
        "|---|---|---|---|",
        *[
            f"| `{f['function']}` | {f['calls_per_step']:.1f} | {f['own_ms_per_step']:.2f} | "
            f"{f['cumulative_ms_per_step']:.2f} |"
            for f in out["top_cumulative"]
        ],
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--log-dir", default="artifacts/bench-unwind-profile")
    parser.add_argument(
        "--worker",
        action="store_true",
        help="also the same unwinds on one real Procfile worker, under py-spy",
    )
    args = parser.parse_args(argv)
    database_url = os.environ["BENCH_DATABASE_URL"]
    redis_url = os.environ["REDIS_URL"]
    os.makedirs(args.log_dir, exist_ok=True)
    fresh_database(database_url)
    env = child_env(
        database_url=database_url, redis_url=redis_url, port=0, settings_module="saga_admin.settings"
    )
    setup_django(env)
    from django.core.management import call_command
    from redis import Redis

    Redis.from_url(redis_url).flushdb()
    call_command("migrate", verbosity=0)
    try:
        out = measure(steps=args.steps, top=args.top, redis_url=redis_url, log_dir=args.log_dir)
        if args.worker:
            out["worker"] = measure_worker(
                steps=args.steps, top=args.top, env=env, redis_url=redis_url, log_dir=args.log_dir
            )
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(database_url)
        Redis.from_url(redis_url).flushdb()
    print(json.dumps(out, indent=2, default=str))
    print("\n".join(markdown(out)))
    if "worker" in out:
        w = out["worker"]
        print(
            f"One Procfile worker process, the same work: {w['steps']} steps in {w['seconds']:.2f} s = "
            f"{w['per_step_ms']:.1f} ms a step, {w['worker_cpu_ms_per_step']:.1f} ms of the worker's CPU a step "
            f"(py-spy on its main thread, {w['py_spy']['main_thread_samples']} samples at 200/s, waiting "
            "included, from just before the commit to just after the last step):"
        )
        for part in w["py_spy"]["parts"]:
            print(f"  {part['share'] * 100:5.1f}%  {part['part']}")


if __name__ == "__main__":
    main()
