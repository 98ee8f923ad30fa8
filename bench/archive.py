"""The archiver's rate on its own: about ``--archive-runs`` runs of ~10 actions
over a year, with their audit chains, seeded by ``bench.size_seed`` (COPY) with a retention of one
second (every closed run is due), then one
``archive_runs`` pass over them, or over ``--archive-limit`` of them (the rate at a big table's size
without archiving all of it: ``--archive-runs 100000 --archive-limit 3000`` is 1M actions), in this
process as ``manage.py archive_runs`` runs it, while 16 agents append, against the append alone
just before. The size phase measures the same archiver at
a year's size; this phase is the one a shared machine finishes in a few minutes.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from bench import fixtures
from bench.loadgen import LoadControl, LoadResult
from bench.size_world import tenants_and_keys
from bench.stats import log, summarize

if TYPE_CHECKING:
    from bench.harness import Harness

TENANT = "bench-archive"
CLIENTS = 16
PER_RUN = 10
MEAN_ACTIONS = 10
RETENTION = "1s"


def seed(h: Harness, runs: int) -> dict[str, Any]:
    """About ``runs`` runs of ``MEAN_ACTIONS`` actions spread over a year, with the audit chains the
    services write (``bench.size_seed``: the size phase's seed, at this phase's size; ``seed_bench``
    writes no chains, and the archiver refuses a run whose chain does not match its head)."""
    from django.db import connection

    from bench import size_seed

    spec = size_seed.Spec(
        actions=runs * MEAN_ACTIONS,
        mean_actions=MEAN_ACTIONS,
        open_items=0,
        pending_approvals=0,
        running=0,
        big_runs=(),
        workers=2,
        drop_all_indexes=False,
        tenants=tenants_and_keys(),
    )
    connection.close()
    out = size_seed.seed(h.database_url, spec, log=lambda _: None)
    return {"seconds": out["timings"]["total_s"], "counts": out["counts"]}


def _configure(h: Harness) -> str:
    """The archive's destination (a local folder), its key, and ``audit.retention`` in the global
    policy document (the bench's policies beside it)."""
    from django.conf import settings
    from django.core.management import call_command

    folder = (h.log_dir / "archive-phase").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    url = f"file://{folder}"
    key = os.environ.setdefault("SAGA_AUDIT_KEY", "bench-archive-audit-key-not-for-production-0123456789")
    if not getattr(settings, "AUDIT_KEY", ""):
        settings.AUDIT_KEY = key
    os.environ["SAGA_ARCHIVE_ALLOWED_URLS"] = url
    settings.SAGA = {**settings.SAGA, "ARCHIVE_ALLOWED_URLS": [url]}
    document = {**fixtures.BENCH_POLICIES, "audit": {"retention": {"closed_runs": RETENTION, "archive": url}}}
    path = h.log_dir / "archive-phase-policies.json"
    path.write_text(json.dumps(document, indent=2))
    call_command("load_policies", str(path), verbosity=0, stdout=io.StringIO())
    return url


def _pass_under_append(
    h: Harness, params: dict[str, Any], web: Any, *, limit: int
) -> tuple[dict[str, Any], LoadResult]:
    from recovery.archive import runner

    control = LoadControl()
    loaded: dict[str, LoadResult] = {}
    failure: list[BaseException] = []

    def append_load() -> None:
        try:
            loaded["result"] = h.load(
                "record_action", CLIENTS, params, web=web, window_s=1800, control=control
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            failure.append(exc)

    thread = threading.Thread(target=append_load, name="archive-append-load", daemon=True)
    thread.start()
    try:
        if not control.wait_window(timeout=300):
            raise RuntimeError("the append load's window did not begin within 300 s")
        started = time.perf_counter()
        result = runner.runs_archive(limit=limit)
        seconds = time.perf_counter() - started
    finally:
        control.stop()
        thread.join(timeout=h.sizes.warmup_s + 300)
    if failure:
        raise failure[0]
    archived = len(result.archived)
    why: dict[str, int] = {}
    for outcome in result.skipped:
        why[outcome.detail[:80]] = why.get(outcome.detail[:80], 0) + 1
    return (
        {
            "seconds": seconds,
            "archived": archived,
            "skipped": len(result.skipped),
            "skipped_why": why,
            "errors": list(result.errors)[:5],
            "runs_per_s": archived / seconds if seconds else 0.0,
            "runs_per_transaction": getattr(runner, "RUNS_PER_TRANSACTION", 1),
        },
        loaded["result"],
    )


def measure(harness: Harness) -> dict[str, Any]:
    runs = max(1, int(getattr(harness.args, "archive_runs", 2000)))
    limit = min(runs, int(getattr(harness.args, "archive_limit", None) or runs))
    out: dict[str, Any] = {"runs": runs, "limit": limit, "mean_actions": MEAN_ACTIONS, "clients": CLIENTS}
    keys = fixtures.agent_keys(tenant_slug=TENANT, count=CLIENTS)
    fixtures.load_bench_policies(harness.log_dir)
    log(f"archive: seeding ~{runs} runs of ~{MEAN_ACTIONS} actions over a year (bench.size_seed)")
    out["seed"] = seed(harness, runs)
    headers = {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(CLIENTS)}
    window = harness.sizes.warmup_s + harness.sizes.window_s
    baseline_runs = fixtures.fresh_runs(keys=keys, per_client=int(250 * window / PER_RUN / CLIENTS) + 2)
    during_runs = fixtures.fresh_runs(keys=keys, per_client=int(250 * 120 / PER_RUN / CLIENTS) + 2)
    out["archive"] = _configure(harness)
    time.sleep(1.1)  # every seeded run is past its one-second window (and the fresh runs are running)
    web = harness.start_web("web-archive")
    try:
        log(f"archive: append baseline, {CLIENTS} clients, no archiver")
        params = {"runs": baseline_runs, "per_run": PER_RUN, "headers_per_client": headers}
        out["append_before"] = summarize(
            harness.load("record_action", CLIENTS, params, web=web), "record_action"
        )
        log(f"archive: one archive_runs pass over {limit} of the closed runs while {CLIENTS} clients append")
        params = {"runs": during_runs, "per_run": PER_RUN, "headers_per_client": headers}
        out["pass"], during = _pass_under_append(harness, params, web, limit=limit)
        out["append_during"] = summarize(during, "record_action")
    finally:
        web.stop()
    return out


def phase(h: Harness) -> None:
    h.section("archive").update(measure(h))


# --- The archiver taken apart: ``python -m bench.archive --profile N`` ---------------------------


def profile(limit: int, top: int) -> dict[str, Any]:
    """One ``runs_archive`` pass over ``limit`` due runs of a database this phase seeded and kept
    (``--keep-db``), in this process, under ``cProfile`` with every statement counted."""
    import cProfile
    import pstats

    from django.db import connection

    from bench.unwind_profile import _Statements
    from recovery.archive import runner

    counter = _Statements()
    prof = cProfile.Profile()
    started, started_cpu = time.perf_counter(), time.process_time()
    with connection.execute_wrapper(counter):
        prof.enable()
        result = runner.runs_archive(limit=limit)
        prof.disable()
    seconds, cpu = time.perf_counter() - started, time.process_time() - started_cpu
    archived = len(result.archived) or 1
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][3], reverse=True)  # type: ignore[attr-defined]
    return {
        "archived": len(result.archived),
        "skipped": len(result.skipped),
        "seconds": seconds,
        "runs_per_s": len(result.archived) / seconds if seconds else 0.0,
        "ms_per_run": seconds / archived * 1000,
        "cpu_ms_per_run": cpu / archived * 1000,
        "sql_ms_per_run": counter.seconds / archived * 1000,
        "statements_per_run": sum(counter.kinds.values()) / archived,
        "statement_kinds_per_run": {k: round(v / archived, 2) for k, v in counter.kinds.most_common(15)},
        "top_cumulative": [
            {
                "function": f"{f[0].split('site-packages/')[-1].split('/work/main/')[-1]}:{f[1]} {f[2]}",
                "cumulative_ms_per_run": v[3] / archived * 1000,
                "own_ms_per_run": v[2] / archived * 1000,
            }
            for f, v in rows[:top]
        ],
    }


def main(argv: list[str] | None = None) -> None:
    import argparse

    from bench.environment import child_env, setup_django

    parser = argparse.ArgumentParser(description=profile.__doc__)
    parser.add_argument("--profile", type=int, required=True, help="due runs the profiled pass archives")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--log-dir", required=True, help="the kept run's --log-dir (its archive folder)")
    args = parser.parse_args(argv)
    from pathlib import Path

    folder = (Path(args.log_dir) / "archive-phase").resolve()
    env = child_env(
        database_url=os.environ["BENCH_DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        port=0,
        settings_module="saga_admin.settings",
    )
    env["SAGA_AUDIT_KEY"] = os.environ.get(
        "SAGA_AUDIT_KEY", "bench-archive-audit-key-not-for-production-0123456789"
    )
    env["SAGA_ARCHIVE_ALLOWED_URLS"] = f"file://{folder}"
    os.environ.update(env)
    setup_django(env)
    out = profile(args.profile, args.top)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
