"""What a job costs on each of RQ's worker options, and what the periodic pass costs.

Each option is started as a real process on a fresh database and this run's Redis database, then
timed on the same work: L3 no-op jobs on ``notifications`` and on ``compensations`` (a batch), and
unwinds of the ``bench.undo`` no-op Python compensator (one alone, then several at once). Then the
periodic pass in this process: an idle pass (every duty asks its question and finds nothing) and
a pass over a backlog of lost outbox rows (the notification sweep's bounded batch).

    python -m bench.worker_classes [--jobs 300] [--steps 30] [--concurrent 10]

Prints the figures as JSON and as markdown rows (docs/BENCHMARKS.md, "Worker classes").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench import baselines, procs, unwinds
from bench.databases import drop_database, fresh_database
from bench.environment import child_env, setup_django
from bench.procs import ROOT

SAGA_WORKER = "python -m saga_admin saga_worker compensations notifications default"
OPTIONS = {
    # What the Procfile runs: a horse forked for an unwind's job only.
    "procfile (fork compensations only)": procs.worker_command(),
    "forking Worker (every job forked)": f"{SAGA_WORKER} --fork all",
    "in-process (no job forked)": f"{SAGA_WORKER} --fork none",
    "rq SimpleWorker (bench/candidate_worker)": "python -m bench.candidate_worker compensations notifications default",
    "rqworker-pool, 2 forking workers": "python -m saga_admin rqworker-pool compensations notifications default "
    "--num-workers 2",
}


def _wait_registered(redis_url: str, count: int, timeout: float = 90) -> None:
    from redis import Redis
    from rq import Worker

    redis = Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([w for w in Worker.all(connection=redis) if w.state in ("idle", "busy")]) >= count:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{count} worker(s) did not register within {timeout}s")


def _wait_gone(redis_url: str, timeout: float = 30) -> None:
    from redis import Redis
    from rq import Worker

    redis = Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    while Worker.all(connection=redis) and time.monotonic() < deadline:
        time.sleep(0.2)


def measure_option(
    name: str, command: str, *, env: dict[str, str], redis_url: str, args: Any
) -> dict[str, Any]:
    proc = procs.start(name.split()[0], command, env, Path(args.log_dir))
    try:
        _wait_registered(redis_url, 2 if "pool" in name else 1)
        # Warm: imports, first connections, the policies cached.
        baselines.l3_batch(redis_url=redis_url, jobs=10, queue_name="notifications")
        out: dict[str, Any] = {}
        for queue in ("notifications", "compensations"):
            result = baselines.l3_batch(redis_url=redis_url, jobs=args.jobs, queue_name=queue)
            out[f"noop_{queue}_ms"] = result.per_job_ms
        measured = unwinds.measure(steps=args.steps, concurrent=args.concurrent, log_dir=Path(args.log_dir))
        out["unwind_single_ms_per_step"] = measured["single"]["per_step_ms"]
        out["unwind_concurrent_ms_per_step"] = measured["concurrent"]["per_step_ms"]
        out["unwind_statuses"] = measured["concurrent"]["unwind_statuses"]
        out["worker_cpu_s"] = proc.cpu_seconds()
        return out
    finally:
        proc.stop()
        _wait_gone(redis_url)


def _outbox_history(tenant: Any, rows: int) -> None:
    """``rows`` outbox rows that an idle pass must not work on: delivered (most), failed for good,
    dropped, and pending with a retry due in an hour: what a busy installation's outbox holds
    between prunes."""
    from datetime import timedelta

    from django.utils import timezone

    from recovery.models import Notification

    now = timezone.now()
    status = Notification.Status
    fates = [status.DELIVERED] * 17 + [status.FAILED, status.DROPPED, status.PENDING]
    batch: list[Notification] = []
    for i in range(rows):
        fate = fates[i % len(fates)]
        batch.append(
            Notification(
                tenant=tenant,
                channel_name="bench",
                kind="webhook",
                env_target="http://127.0.0.1:9/",
                event="step.failed",
                subject_id=f"h{i}",
                status=fate,
                attempts=1,
                next_attempt_at=now + timedelta(hours=1) if fate == status.PENDING else None,
            )
        )
        if len(batch) == 10000:
            Notification.objects.bulk_create(batch)
            batch = []
    Notification.objects.bulk_create(batch)


def _ledger_size() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_action, ledger_event, recovery_notification")
        cursor.execute(
            "SELECT relname, reltuples::bigint FROM pg_class WHERE relname IN "
            "('ledger_action', 'ledger_event', 'ledger_run', 'recovery_notification')"
        )
        return dict(cursor.fetchall())


def measure_pass(*, redis_url: str, backlog: int, outbox: int = 0) -> dict[str, Any]:  # noqa: PLR0915 - one measurement, in order
    """The periodic pass in this process: idle (beside ``outbox`` rows of history that are not
    due), then over ``backlog`` lost outbox rows."""
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone
    from redis import Redis

    from ledger.models import Tenant
    from recovery import jobs, scheduling, sweeper
    from recovery.models import Notification

    redis = Redis.from_url(redis_url)

    def fresh_keys() -> None:
        for key in redis.scan_iter("saga:periodic:*"):
            redis.delete(key)

    cpu: list[float] = []

    def one_pass() -> tuple[float, int, scheduling.TickReport]:
        fresh_keys()
        with CaptureQueriesContext(connection) as queries:
            started, started_cpu = time.perf_counter(), time.process_time()
            report = scheduling.tick_report(jobs.periodic_run)
            elapsed = time.perf_counter() - started
            cpu.append(time.process_time() - started_cpu)
        return elapsed, len(queries), report

    Notification.objects.all().delete()
    tenant = Tenant.objects.order_by("pk").first() or Tenant.objects.create(slug="bench", name="bench")
    if outbox:
        _outbox_history(tenant, outbox)
    sizes = _ledger_size()
    one_pass()  # warm: the first pass plans every question
    cpu.clear()
    idle = [one_pass() for _ in range(20)]
    idle_ms = statistics.median(t for t, _q, _r in idle) * 1000
    per_duty = {}
    for periodic in scheduling.periodic_jobs():
        if periodic.due is not None:
            started = time.perf_counter()
            for _ in range(10):
                periodic.due(timezone.now())
            per_duty[periodic.func.rsplit(".", 1)[1]] = round((time.perf_counter() - started) * 100, 2)
    now = timezone.now()
    Notification.objects.bulk_create(
        [
            Notification(
                tenant=tenant,
                channel_name="bench",
                kind="webhook",
                env_target="http://127.0.0.1:9/",
                event="step.failed",
                subject_id="s",
                next_attempt_at=now - timedelta(minutes=10, seconds=i),
            )
            for i in range(backlog)
        ],
        batch_size=5000,
    )
    sweeper._notification_cursor.clear()
    sweeps = []
    for _ in range(5):
        started = time.perf_counter()
        report = sweeper.notifications_sweep()
        sweeps.append((time.perf_counter() - started, report.read, report.reenqueued))
    # The soak's case: the rows' jobs are alive, waiting behind a backlog (one queued job stands
    # for them all): a pass reads its batch and hands nothing back.
    from rq import Queue

    redis.delete("rq:queue:notifications")
    waiting = Queue("notifications", connection=redis).enqueue("bench.jobs.noop")
    Notification.objects.filter(subject_id="s").update(job_id=waiting.id, updated_at=timezone.now())
    sweeper._notification_cursor.clear()
    alive = []
    for _ in range(5):
        started = time.perf_counter()
        report = sweeper.notifications_sweep()
        alive.append((time.perf_counter() - started, report.read, report.reenqueued))
    redis.delete("rq:queue:notifications")
    Notification.objects.all().delete()
    interval = 5.0
    return {
        "table_rows": sizes,
        "outbox_history": outbox,
        "idle_pass_ms": idle_ms,
        "idle_pass_cpu_ms": statistics.median(cpu) * 1000,
        "idle_pass_queries": idle[-1][1],
        "question_ms_per_duty": per_duty,
        "idle_pass_duties": len(idle[-1][2].idle),
        "idle_share_of_5s": idle_ms / (interval * 1000),
        "backlog": backlog,
        "sweep_ms": [round(t * 1000, 1) for t, _r, _e in sweeps],
        "sweep_read": [r for _t, r, _e in sweeps],
        "sweep_reenqueued": [e for _t, _r, e in sweeps],
        "alive_sweep_ms": [round(t * 1000, 1) for t, _r, _e in alive],
        "alive_sweep_reenqueued": [e for _t, _r, e in alive],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=10)
    parser.add_argument("--backlog", type=int, default=20000)
    parser.add_argument("--only", default="", help="comma-separated option names' first words")
    parser.add_argument("--pass-only", action="store_true", help="only the periodic pass, no worker option")
    parser.add_argument(
        "--existing",
        action="store_true",
        help="BENCH_DATABASE_URL is a seeded database (a --keep-db run's): measure on it, do not drop it",
    )
    parser.add_argument("--outbox", type=int, default=0, help="outbox rows of history beside the idle pass")
    parser.add_argument("--log-dir", default=str(ROOT / "artifacts" / "bench-workers"))
    args = parser.parse_args(argv)
    database_url = os.environ["BENCH_DATABASE_URL"]
    redis_url = os.environ["REDIS_URL"]
    if not args.existing:
        fresh_database(database_url)
    env = child_env(
        database_url=database_url, redis_url=redis_url, port=0, settings_module="saga_admin.settings"
    )
    env["SAGA_SWEEP_INTERVAL_S"] = "5"
    setup_django(env)
    from django.core.management import call_command
    from redis import Redis

    Redis.from_url(redis_url).flushdb()
    call_command("migrate", verbosity=0)
    results: dict[str, Any] = {}
    try:
        for name, command in OPTIONS.items():
            if args.pass_only or (args.only and name.split()[0] not in args.only.split(",")):
                continue
            print(f"measuring {name} …", flush=True)
            results[name] = measure_option(name, command, env=env, redis_url=redis_url, args=args)
            print(json.dumps(results[name]), flush=True)
        results["periodic pass"] = measure_pass(redis_url=redis_url, backlog=args.backlog, outbox=args.outbox)
    finally:
        if args.existing:
            from recovery.models import Notification

            Notification.objects.filter(channel_name="bench").delete()
        else:
            drop_database(database_url)
    print(json.dumps(results, indent=2, default=str))
    for name, r in results.items():
        if "noop_notifications_ms" in r:
            print(
                f"| {name} | {r['noop_notifications_ms']:.1f} | {r['noop_compensations_ms']:.1f} | "
                f"{r['unwind_single_ms_per_step']:.1f} | {r['unwind_concurrent_ms_per_step']:.1f} |"
            )


if __name__ == "__main__":
    main()
