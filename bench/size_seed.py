"""A year of ledger history, fast: millions of runs, actions and audit events by ``COPY``.

What ``make bench``'s "At size" phase (``bench/size.py``) measures against. ``seed_bench`` fills
the dashboard's tables for the pages; this fills everything that grows with traffic, the audit
log included, at the target's size (10 million actions, ~30 million events) in minutes:

- runs are generated in time order (a year, evenly spread: steady traffic), so ids, chains and
  ``created_at`` grow the way a live system's do and most indexes take their rows at their right
  edge; the few indexes on random keys (an event's hash, an action's target) are dropped before
  the load and built once after it, which is what makes the difference between minutes and
  hours (``RANDOM_KEY_INDEXES``);
- ``workers`` processes each write one slice of the year over their own connection (``COPY``
  text, built as strings: the row formatting is the cost), committing every ``BATCH_RUNS`` runs;
- each session runs with ``session_replication_role = replica`` (triggers and foreign-key checks
  off: the rows are consistent by construction, and checked after: ``check``) and
  ``synchronous_commit = off``.

The rows are ``recovery.management.seeding``'s (the ones ``seed_bench`` writes too), with their
audit chains: every run's chain is what the services write for it, hashed exactly as
``ledger.audit`` hashes (``check`` verifies a sample with ``audit_verify``), and the run's
``audit_head`` is its chain's last hash. Runs end in every status; the ones of the last
days are running, waiting for approval or failed with an open recovery item; a year's worth are
closed. Actions per run vary (1 to ~60); two failed runs in the queue have ``big_runs`` actions
(200 and 5,000 by default: the run page's two sizes).
"""

from __future__ import annotations

import multiprocessing
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from recovery.management import seeding
from recovery.management.seeding import AGENT_WEIGHTS, CopyRows, RunBuilder

BATCH_RUNS = 2000
DAY = 86400.0

# The agents of the year (each tenant gives each of them a key) and the tenants' shares: seed_bench's
# catalogue, so the two seeds describe the same agents' work.
AGENTS = seeding.AGENTS[:6]
TENANT_WEIGHTS = [share for _, _, share in seeding.TENANTS]
# The counts of the rows this seed reports.
COUNTED = ("runs", "actions", "events", "items", "approvals")

# Indexes whose keys arrive in random order (a hash, a random target id): each insert touches a
# random leaf, so a 30-million-row load keeps rewriting the whole index. Dropped before the load
# and built once after it. The rest take their keys in time order and stay.
RANDOM_KEY_INDEXES = {
    "ledger_event": ["ledger_event_hash_key", "ledger_event_hash_79a381be_like"],
    "ledger_action": ["action_tenant_target"],
}
# With ``drop_all_indexes``: every index of these tables but the primary key, built after the load.
DROPPED_TABLES = ("ledger_event", "ledger_action")


@dataclass
class Spec:
    """What to seed: ``actions`` in total over ``days``, about ``mean_actions`` per run."""

    actions: int
    days: int = 365
    mean_actions: int = 15
    open_items: int = 2000
    pending_approvals: int = 500
    running: int = 500
    big_runs: tuple[int, ...] = (200, 5000)
    workers: int = 2
    drop_all_indexes: bool = True
    seed: int = 30
    # (tenant id, [(key id, agent name)]) per tenant, made by the caller through the services.
    tenants: list[tuple[int, list[tuple[str, str]]]] = field(default_factory=list)
    now: datetime = field(default_factory=lambda: datetime.now(UTC))


def _fate(rng: random.Random, age_s: float, spec: Spec, recent_runs: float) -> str:
    """A run's end by its age: the last three days hold the live work (running, waiting, open
    items), everything older has ended."""
    if age_s < 3 * DAY:
        r = rng.random() * recent_runs
        if r < spec.open_items:
            return "open"
        if r < spec.open_items + spec.pending_approvals:
            return "awaiting"
        if r < spec.open_items + spec.pending_approvals + spec.running:
            return "running"
    r = rng.random()
    if r < 0.90:
        return "succeeded"
    if r < 0.92:
        return "cancelled"
    return "closed" if r < 0.96 else "compensated"


def _worker(dsn: str, spec: Spec, index: int, first: int, last: int, total: int, queue: Any) -> None:
    import psycopg

    rng = random.Random(spec.seed * 1000 + index)
    span = spec.days * DAY
    start = spec.now - timedelta(seconds=span)
    recent_runs = max(1.0, total * 3 * DAY / span)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("SET synchronous_commit = off")
        rows = CopyRows()
        builder = RunBuilder(rows, rng, now=spec.now, audit=True, source="bench.size_seed")

        def flush() -> None:
            with conn.transaction(), conn.cursor() as cursor:
                rows.copy_into(cursor)

        # Actions per run: 1 + a geometric number with the wanted mean (most runs short, a tail).
        p = 1 / spec.mean_actions
        for i in range(first, last):
            created = start + timedelta(seconds=span * (i + rng.random()) / total)
            age_s = (spec.now - created).total_seconds()
            fate = _fate(rng, age_s, spec, recent_runs)
            n = min(60, 1 + int(rng.expovariate(p)))
            tenant_id, keys = rng.choices(spec.tenants, TENANT_WEIGHTS[: len(spec.tenants)])[0]
            key_id, agent = rng.choices(keys, AGENT_WEIGHTS[: len(keys)])[0]
            builder.build(tenant_id=tenant_id, key_id=key_id, agent=agent, created=created, fate=fate, n=n)
            if (i - first + 1) % BATCH_RUNS == 0:
                flush()
        if index == 0:
            # The run page's sizes: failed runs in the first tenant's queue, an hour old.
            tenant_id, keys = spec.tenants[0]
            for size in spec.big_runs:
                created = spec.now - timedelta(hours=1, seconds=rng.uniform(0, 600))
                builder.build(
                    tenant_id=tenant_id,
                    key_id=keys[0][0],
                    agent=keys[0][1],
                    created=created,
                    fate="open",
                    n=size,
                )
        flush()
    queue.put({key: rows.counts[key] for key in COUNTED})


def _indexes(conn: Any, tables: tuple[str, ...]) -> list[tuple[str, str, str, str | None]]:
    """(table, index, CREATE INDEX …, constraint type or None) of ``tables``' indexes but their
    primary keys."""
    rows = conn.execute(
        "SELECT t.relname, ix.relname, pg_get_indexdef(i.indexrelid), c.contype FROM pg_index i "
        "JOIN pg_class ix ON ix.oid = i.indexrelid JOIN pg_class t ON t.oid = i.indrelid "
        "LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid "
        "WHERE t.relname = ANY(%s) AND NOT i.indisprimary ORDER BY t.relname, ix.relname",
        [list(tables)],
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def _drop_indexes(dsn: str, spec: Spec) -> list[tuple[str, str, str, str | None]]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        dropped = _indexes(conn, DROPPED_TABLES if spec.drop_all_indexes else ())
        dropped += [
            d
            for d in _indexes(conn, tuple(RANDOM_KEY_INDEXES))
            if d[1] in RANDOM_KEY_INDEXES[d[0]] and d not in dropped
        ]
        for table, name, _, contype in dropped:
            if contype:
                conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
            else:
                conn.execute(f'DROP INDEX "{name}"')
    return dropped


def _build_indexes(dsn: str, dropped: list[tuple[str, str, str, str | None]]) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        for table, name, definition, contype in dropped:
            conn.execute(definition)
            if contype == "u":
                conn.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" UNIQUE USING INDEX "{name}"')


def _copy_in_parallel(dsn: str, spec: Spec, total_runs: int) -> dict[str, int]:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    workers = max(1, spec.workers)
    bounds = [total_runs * k // workers for k in range(workers + 1)]
    procs = [
        ctx.Process(target=_worker, args=(dsn, spec, k, bounds[k], bounds[k + 1], total_runs, queue))
        for k in range(workers)
    ]
    for proc in procs:
        proc.start()
    counts: dict[str, int] = {}
    for _ in procs:
        for key, value in queue.get().items():
            counts[key] = counts.get(key, 0) + value
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a seeding worker failed (exit {proc.exitcode})")
    return counts


def seed(dsn: str, spec: Spec, *, log: Any = print) -> dict[str, Any]:
    """Seed ``spec`` into the database at ``dsn`` (migrated, with its tenants and keys made);
    return the counts and where the time went."""
    import psycopg

    timings: dict[str, float] = {}
    total_runs = max(1, spec.actions // spec.mean_actions)
    t0 = time.perf_counter()
    dropped = _drop_indexes(dsn, spec)
    timings["drop_indexes_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    counts = _copy_in_parallel(dsn, spec, total_runs)
    timings["copy_s"] = time.perf_counter() - t1
    log(f"size seed: COPY done in {timings['copy_s']:.0f}s: {counts}")
    t2 = time.perf_counter()
    _build_indexes(dsn, dropped)
    timings["build_indexes_s"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in (
            "ledger_run",
            "ledger_action",
            "ledger_event",
            "recovery_recoveryitem",
            "recovery_approval",
        ):
            conn.execute(f"VACUUM (ANALYZE) {table}")
    timings["vacuum_analyze_s"] = time.perf_counter() - t3
    timings["total_s"] = time.perf_counter() - t0
    return {
        "counts": counts,
        "timings": timings,
        "workers": max(1, spec.workers),
        "runs_planned": total_runs,
        "indexes_built_after": [name for _, name, _, _ in dropped],
    }


def check(*, sample: int = 200, seed: int = 1) -> dict[str, Any]:
    """The seeded data is what the product would have written: ``audit_verify`` and
    ``audit_heads_verify`` pass on a sample of runs (the big ones included), and no action or
    event points at a run that is not there."""
    from django.db import connection

    from ledger.audit import audit_heads_verify, audit_verify
    from ledger.models import Run

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(%s)", [1 / (seed + 1)])
        cursor.execute("SELECT id FROM ledger_run ORDER BY random() LIMIT %s", [sample])
        ids = [r[0] for r in cursor.fetchall()]
    ids += list(Run.objects.filter(action_count__gte=200).values_list("pk", flat=True))
    checked = 0
    problems = []
    for run_id in ids:
        n, broken = audit_verify(chain=f"run:{run_id}")
        checked += n
        if broken is not None:
            problems.append(f"{broken.chain} event {broken.event_id}: {broken.problem}")
        problems += [f"{gap.chain}: truncated" for gap in audit_heads_verify(chain=f"run:{run_id}")]
    return {
        "runs": len(ids),
        "events": checked,
        "problems": problems[:10],
        "ok": not problems and checked > 0,
        "seconds": time.perf_counter() - started,
    }
