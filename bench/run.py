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
     EXPLAIN (ANALYZE) of every query the pages run; then reads (bench/reads.py): the
     agent's GETs against the append at 16 clients, the run page with 200 and 5,000 actions;
  4. unwind throughput with no-op Python compensators on the Procfile's worker;
  5. servers: the hot path (append, the framework floor, heartbeat, the full step; 16 clients) on
     the Procfile's web line and on each candidate server configuration (gunicorn sync/gthread,
     granian), one after another; the restated targets come from the Procfile's line;
  6. workers: 200 I/O-bound compensations (a 200 ms webhook) by 1, then 4 Procfile workers;
  7. bulk: 10k open items of one reason, the bulk preview of their filter, then a bulk that closes
     them all on one Procfile worker while 16 clients append (bench/bulk.py);
  8. size: a year of history in its own database (10M actions, ~30M audit events by COPY), then
     the append, the pages and API lists, a governed tool call and retention at that size
     (bench/size.py);
  9. soak: 8 agents record onboarding sagas for 90 s, a third failing, an operator compensating
     each through the API, the one Procfile worker SIGKILLed at 30 s and restarted, the soak's own
     Redis down 6 s at 55 s (bench/soak.py).
It prints one table and writes docs/BENCHMARKS.md (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    append,
    archive,
    audit_stream,
    baselines,
    bulk,
    dashboard,
    images,
    machine,
    procs,
    reads,
    record_size,
    refusals,
    report,
    scale,
    servers,
    size,
    soak,
    tracing,
    unwinds,
)
from bench.databases import claim_redis_db, drop_database
from bench.harness import Harness
from bench.procs import ROOT
from bench.stats import log

# The phases in the order they run (``--only`` names them), each writing its section of the results.
PHASES: tuple[tuple[str, Callable[[Harness], None]], ...] = (
    ("baselines", baselines.phase),
    ("append", append.phase),
    ("traces", tracing.phase),
    ("unauthenticated", refusals.phase),
    ("record_size", record_size.phase),
    ("audit_stream", audit_stream.phase),
    ("dashboard", dashboard.phase),
    ("reads", reads.phase),
    ("unwind", unwinds.phase),
    ("images", images.phase),
    ("servers", servers.phase),
    ("workers", scale.phase),
    ("bulk", bulk.phase),
    ("archive", archive.phase),
    ("size", size.phase),
    ("soak", soak.phase),
)


def run(h: Harness) -> int:
    """Every phase asked for, one after another (a phase that fails is reported, the next one
    runs), then the results and the report written; 1 when a phase failed."""
    started = time.monotonic()
    h.prepare()
    only = set(h.args.only.split(",")) if h.args.only else None
    for name, phase in PHASES:
        if only and name not in only:
            continue
        h.results.setdefault("load", {})[name] = machine.loadavg()
        try:
            phase(h)
        except Exception as exc:  # noqa: BLE001 - a phase that cannot run is reported, not hidden
            log(f"phase {name} failed: {exc!r}")
            h.results["errors"].append(
                {"phase": name, "error": repr(exc), "traceback": traceback.format_exc()}
            )
    h.results["elapsed_s"] = time.monotonic() - started
    h.results["smoke"] = h.args.smoke
    # The lines measured, kept with the figures (the Procfile may change after a run).
    h.results["procfile"] = procs.procfile_lines()
    h.results["load_after"] = machine.loadavg()
    # The figures first: a report that fails to render can be rendered again (--render).
    h.log_dir.mkdir(parents=True, exist_ok=True)
    (h.log_dir / "results.json").write_text(json.dumps(h.results, indent=2, default=str))
    text, markdown = report.render(h.results, smoke=h.args.smoke)
    print(text)
    out = Path(h.args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown)
    log(f"wrote {out} and {h.log_dir / 'results.json'}")
    return 1 if h.results["errors"] else 0


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
        help="comma-separated phases: " + ",".join(name for name, _ in PHASES),
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
    parser.add_argument(
        "--archive-limit",
        type=int,
        default=None,
        help="runs the timed archive pass takes (default: all it seeded): the rate at a big table's size "
        "without archiving all of it",
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
    soak.add_options(parser)
    parser.add_argument(
        "--render",
        metavar="RESULTS_JSON",
        default="",
        help="only re-render the report (e.g. after editing bench/findings.md) from a run's results",
    )
    args = parser.parse_args(argv)
    if args.render:
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
        return run(harness)
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
