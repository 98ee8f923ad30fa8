"""Bulk decisions by filter at scale, against their targets: the preview of a filter matching N open
items, then a bulk that closes all of them on the Procfile's worker, while agents keep appending.

- N open recovery items of one reason in one tenant, written by ``seed_bench`` (COPY, the shapes
  the dashboard phase uses; every item ``open``, none claimed, so every one is decidable);
- the Procfile's web line and ``--bulk-workers`` Procfile workers (the bulk's lanes share them);
- over HTTP with an operator key of that tenant: ``POST /api/v1/recovery/bulk`` with
  ``preview: true`` several times (the first, warming the web process, is not counted);
- the append (``record_action``, 16 clients, the tenant's own agents) alone for one window: the
  baseline; then the same load again, and once its window has begun the bulk is started
  (``expected_count``: the previewed count) and ``GET /api/v1/recovery/bulk/{id}`` polled until it
  is no longer running; the load's window ends there, so its p99 is the append's *during* the bulk.

The bulk's duration is the server's own (``finished_at - started_at`` of the operation); the time
the poll saw it finished is kept beside it.
"""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from bench import fixtures
from bench.loadgen import Client, LoadControl, LoadResult, percentile
from bench.procs import ROOT
from bench.stats import log, summarize
from bench.tables import fmt, load_row

if TYPE_CHECKING:
    from bench.harness import Harness

TENANT = "bench-bulk"
REASON = "failed"
ACTION = "close"
CLIENTS = 16
# Each run of the append gets this many actions before its client moves to a fresh one.
PER_RUN = 10
POLL_S = 0.25


def seed(items: int) -> dict[str, Any]:
    """``items`` failed runs (3 actions each), each with its open item of reason ``REASON``, in
    ``TENANT``; through ``seed_bench``'s COPY."""
    from django.core.management import call_command

    out = io.StringIO()
    started = time.monotonic()
    call_command(
        "seed_bench",
        runs=items,
        actions_per_run=3,
        open_items=items,
        pending_approvals=0,
        resolved_items=0,
        big_runs=0,
        tenant=TENANT,
        reason=REASON,
        claimed_share=0.0,
        stdout=out,
    )
    return {"seconds": time.monotonic() - started, "output": out.getvalue().strip()}


def operator_key() -> str:
    """A key with only the ``operator`` scope in ``TENANT``: who asks for the bulk."""
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create, tenant_get_or_create

    tenant = tenant_get_or_create(slug=TENANT, name="Benchmark bulk")
    issued = agent_key_create(
        tenant=tenant, name="bench-bulk-operator", scopes=["operator"], actor=Actor.system("bench")
    )
    return issued.secret


def _call(client: Client, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    status, data, _ = client.request(method, path, body)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode(errors="replace")[:500]


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "filter": {"reason": REASON},
        "action": ACTION,
        "reason": "benchmark: the upstream outage is over, close the failed runs",
        **extra,
    }


def preview(client: Client, *, samples: int, expected: int) -> dict[str, Any]:
    """``samples`` previews timed one after another, after one that warms the path up."""
    _call(client, "POST", "/api/v1/recovery/bulk", _body(preview=True))
    latencies: list[float] = []
    counts: set[int] = set()
    errors: dict[str, int] = {}
    for _ in range(samples):
        started = time.perf_counter()
        status, data = _call(client, "POST", "/api/v1/recovery/bulk", _body(preview=True))
        latencies.append(time.perf_counter() - started)
        if status != 200:
            errors[str(status)] = errors.get(str(status), 0) + 1
        else:
            counts.add(data["count"])
    latencies.sort()
    return {
        "samples": len(latencies),
        "p50_ms": percentile(latencies, 50) * 1000,
        "p95_ms": percentile(latencies, 95) * 1000,
        "max_ms": latencies[-1] * 1000 if latencies else 0.0,
        "counts": sorted(counts),
        "expected": expected,
        "errors": errors,
    }


def _parse(at: str | None) -> datetime | None:
    return datetime.fromisoformat(at) if at else None


def run_bulk(client: Client, *, expected: int, timeout_s: float) -> dict[str, Any]:
    """Start the bulk and poll it until it is no longer running (or ``timeout_s``)."""
    requested = time.monotonic()
    status, data = _call(client, "POST", "/api/v1/recovery/bulk", _body(expected_count=expected))
    if status != 202:
        raise RuntimeError(f"the bulk did not start: {status} {data}")
    start_ms = (time.monotonic() - requested) * 1000
    bulk_id = data["id"]
    deadline = requested + timeout_s
    polls = 0
    while True:
        status, bulk = _call(client, "GET", f"/api/v1/recovery/bulk/{bulk_id}")
        polls += 1
        if status != 200:
            raise RuntimeError(f"GET the bulk answered {status} {bulk}")
        if bulk["status"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    observed = time.monotonic() - requested
    started_at, finished_at = _parse(bulk["started_at"]), _parse(bulk["finished_at"])
    seconds = (finished_at - started_at).total_seconds() if started_at and finished_at else None
    decided = bulk["done"] + bulk["failed"] + bulk["skipped"]
    return {
        "id": bulk_id,
        "status": bulk["status"],
        "timed_out": bulk["status"] == "running",
        "total": bulk["total"],
        "done": bulk["done"],
        "failed": bulk["failed"],
        "skipped": bulk["skipped"],
        "errors": bulk["errors"][:5],
        "start_request_ms": start_ms,
        "seconds": seconds,
        "observed_s": observed,
        "polls": polls,
        "items_per_s": decided / seconds if seconds else 0.0,
        "ms_per_item": seconds / decided * 1000 if seconds and decided else 0.0,
    }


def _database_check() -> dict[str, int]:
    """What the database says afterwards: the tenant's items by status and resolution."""
    from django.db.models import Count

    from recovery.models import RecoveryItem

    rows = (
        RecoveryItem.objects.filter(tenant__slug=TENANT)
        .values_list("status", "resolution")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {f"{status}/{resolution or '-'}": n for status, resolution, n in rows}


def _statement_kind(sql: str) -> str:
    """``SELECT ledger_run``, ``UPDATE recovery_bulkitem``...: a query's verb and first table."""
    import re

    verb = sql.lstrip().split(" ", 1)[0].upper()
    match = re.search(r'(?:FROM|INTO|UPDATE)\s+"?([a-z_]+)"?', sql, re.IGNORECASE)
    return f"{verb} {match.group(1) if match else '?'}"


def profile(items: int) -> dict[str, Any]:
    """Where one item's decision goes: a second bulk of ``items`` fresh items, started through
    ``bulk_start`` and decided here in this process by ``bulk_advance_chunk`` (the job's body,
    without RQ, without the append load), its queries counted and its Python time profiled."""
    import cProfile
    import pstats
    from collections import Counter

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ledger.audit import Actor
    from ledger.models import AgentKey
    from recovery.actions import bulk_filter, bulk_worker
    from recovery.selectors import QueueFilter

    seed(items)
    key = AgentKey.objects.select_related("tenant").get(tenant__slug=TENANT, name="bench-bulk-operator")
    bulk = bulk_filter.bulk_start(
        tenant=key.tenant,
        queue_filter=QueueFilter(reason=REASON),
        action=ACTION,
        reason="benchmark: profile of a bulk close",
        actor=Actor.for_key(key),
        expected_count=items,
    )
    profiler = cProfile.Profile()
    with CaptureQueriesContext(connection) as captured:
        started = time.perf_counter()
        profiler.enable()
        while bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk, max_items=items, budget_s=3600):
            pass
        profiler.disable()
        elapsed = time.perf_counter() - started
    bulk.refresh_from_db()
    decided = bulk.done + bulk.failed + bulk.skipped
    kinds: Counter[str] = Counter()
    kind_s: dict[str, float] = {}
    for query in captured.captured_queries:
        kind = _statement_kind(query["sql"])
        kinds[kind] += 1
        kind_s[kind] = kind_s.get(kind, 0.0) + float(query["time"])
    sql_s = sum(kind_s.values())
    stats = pstats.Stats(profiler)
    root = f"{ROOT}/"
    rows = []
    for (path, line, func), (_cc, calls, _tt, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        # The project's own functions (their time includes the libraries and queries they call).
        if not path.startswith(root) or "/.venv/" in path or path.startswith(f"{root}bench/"):
            continue
        rows.append((cumulative, f"{path[len(root) :]}:{line} {func}", calls))
    rows.sort(reverse=True)
    return {
        "items": items,
        "decided": decided,
        "done": bulk.done,
        "seconds": elapsed,
        "ms_per_item": elapsed / decided * 1000 if decided else 0.0,
        "queries_per_item": len(captured.captured_queries) / decided if decided else 0.0,
        "sql_ms_per_item": sql_s / decided * 1000 if decided else 0.0,
        "statements_per_item": {k: round(n / decided, 2) for k, n in kinds.most_common(12)}
        if decided
        else {},
        # The round trips' time by statement (COMMIT: the WAL flush each item's transaction waits for).
        "sql_ms_per_item_by_statement": {
            k: round(t / decided * 1000, 2) for k, t in sorted(kind_s.items(), key=lambda kv: -kv[1])[:12]
        }
        if decided
        else {},
        "python_top": [
            {
                "function": name,
                "calls_per_item": round(calls / decided, 2),
                "ms_per_item": ct / decided * 1000,
            }
            for ct, name, calls in rows[:15]
        ]
        if decided
        else [],
    }


def _bulk_under_load(
    harness: Harness, client: Client, web: Any, params: dict[str, Any], *, expected: int
) -> tuple[dict[str, Any], LoadResult]:
    """The bulk, started once the append load's window has begun; the window ends when the poll
    saw the bulk finish."""
    sizes = harness.sizes
    control = LoadControl()
    loaded: dict[str, LoadResult] = {}
    failure: list[BaseException] = []

    def append_load() -> None:
        try:
            loaded["result"] = harness.load(
                "record_action",
                CLIENTS,
                params,
                web=web,
                window_s=sizes.bulk_timeout_s + 60,
                control=control,
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the phase's thread
            failure.append(exc)

    thread = threading.Thread(target=append_load, name="bulk-append-load", daemon=True)
    thread.start()
    try:
        if not control.wait_window(timeout=300):
            raise RuntimeError("the append load's window did not begin within 300 s")
        bulk = run_bulk(client, expected=expected, timeout_s=sizes.bulk_timeout_s)
    finally:
        control.stop()
        thread.join(timeout=sizes.warmup_s + 300)
    if failure:
        raise failure[0]
    return bulk, loaded["result"]


def measure(harness: Harness) -> dict[str, Any]:
    sizes = harness.sizes
    items = sizes.bulk_items
    out: dict[str, Any] = {"items": items, "action": ACTION, "clients": CLIENTS}
    keys = fixtures.agent_keys(tenant_slug=TENANT, count=CLIENTS)
    fixtures.load_bench_policies(harness.log_dir)
    secret = operator_key()
    log(f"bulk: seeding {items} open '{REASON}' items in tenant {TENANT}")
    out["seed"] = seed(items)
    headers = {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(CLIENTS)}
    # Fresh runs for ~250 appends/s over the baseline and over a bulk of up to the target's
    # 2 minutes; a client that runs out goes on recording into its last run.
    baseline_runs = fixtures.fresh_runs(
        keys=keys, per_client=int(250 * (sizes.warmup_s + sizes.window_s) / PER_RUN / CLIENTS) + 2
    )
    during_runs = fixtures.fresh_runs(
        keys=keys, per_client=int(250 * (sizes.warmup_s + sizes.bulk_expected_s) / PER_RUN / CLIENTS) + 2
    )
    web = harness.start_web("web-bulk")
    count = max(1, int(getattr(harness.args, "bulk_workers", 1)))
    out["workers"] = count
    started = harness.start_workers(count) if count > 1 else [harness.start_worker()]
    try:
        client = Client("127.0.0.1", harness.port, headers={"Authorization": f"Bearer {secret}"})
        log(f"bulk: {sizes.bulk_preview_samples} previews of the filter (reason={REASON})")
        out["preview"] = preview(client, samples=sizes.bulk_preview_samples, expected=items)

        log(f"bulk: append baseline, {CLIENTS} clients, no bulk")
        params = {"runs": baseline_runs, "per_run": PER_RUN, "headers_per_client": headers}
        out["append_before"] = summarize(
            harness.load("record_action", CLIENTS, params, web=web), "record_action"
        )

        log(f"bulk: close {items} items on {count} Procfile worker(s) while {CLIENTS} clients append")
        params = {"runs": during_runs, "per_run": PER_RUN, "headers_per_client": headers}
        out["bulk"], during = _bulk_under_load(harness, client, web, params, expected=items)
        out["append_during"] = summarize(during, "record_action")
        out["database"] = _database_check()
    finally:
        for worker in started:
            worker.stop()
        web.stop()
    # After the workers stopped (it would take the profile's job): nothing else of the bench runs.
    log(f"bulk: profile of {sizes.bulk_profile_items} items decided in this process")
    out["profile"] = profile(sizes.bulk_profile_items)
    return out


def phase(h: Harness) -> None:
    h.section("bulk").update(measure(h))


# --- The report -----------------------------------------------------------------------------


# The targets for bulk decisions by filter (full size: 10,000 items).
BULK_PREVIEW_MS = 1000
BULK_SECONDS = 120
BULK_APPEND_P99_MS = 150


def rows(bulk: dict[str, Any]) -> list[list[str]]:
    """The bulk phase (bench/bulk.py): the preview, the bulk itself, the append before and during."""
    rows: list[list[str]] = []
    items = bulk.get("items", 0)
    preview = bulk.get("preview")
    if preview:
        rows.append(
            [
                f"bulk: preview of a filter matching {items:,} items",
                "1",
                "–",
                fmt(preview["p50_ms"], 2),
                fmt(preview["p95_ms"], 2),
                "–",
                fmt(sum(preview["errors"].values())),
                f"{preview['samples']} samples, max {preview['max_ms']:,.0f} ms",
            ]
        )
    run = bulk.get("bulk")
    if run:
        rows.append(
            [
                f"bulk: close {run['total']:,} items ({bulk.get('clients', 16)} clients appending)",
                f"{bulk.get('workers', 1)} worker(s)",
                fmt(run["items_per_s"]) + " items",
                fmt(run["ms_per_item"], 2) + " /item",
                (fmt(run["seconds"], 1) + " s total") if run["seconds"] is not None else "not finished",
                "–",
                fmt(run["failed"]),
                f"{run['status']}: {run['done']:,} done, {run['failed']:,} failed, {run['skipped']:,} skipped",
            ]
        )
    before, during = bulk.get("append_before"), bulk.get("append_during")
    if before:
        rows.append(
            load_row(
                f"bulk: append, record action ({before['clients']} clients), no bulk", before, "baseline"
            )
        )
    if during:
        note = "–"
        if before and before.get("p99_ms"):
            note = f"p99 {during['p99_ms'] / before['p99_ms']:.2f}x the baseline's"
        rows.append(
            load_row(
                f"bulk: append, record action ({during['clients']} clients), during the bulk", during, note
            )
        )
    return rows


def targets(bulk: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    items = bulk.get("items") or 10_000
    names = (
        f"bulk preview of a filter matching {items:,} items < {BULK_PREVIEW_MS / 1000:.0f} s",
        f"bulk decides {items:,} close decisions in < {BULK_SECONDS // 60} minutes, every one decided",
        f"append p99 ≤ {BULK_APPEND_P99_MS} ms (16 clients) while the bulk runs",
    )
    out: list[tuple[str, str, bool | None]] = []
    preview = bulk.get("preview")
    if preview:
        right = preview["counts"] == [preview["expected"]] and not preview["errors"]
        out.append(
            (
                names[0],
                f"p50 {preview['p50_ms']:,.0f} ms, p95 {preview['p95_ms']:,.0f} ms over {preview['samples']} "
                f"previews; count {', '.join(map(str, preview['counts'])) or 'none'}"
                + (f", errors {preview['errors']}" if preview["errors"] else ""),
                preview["p95_ms"] < BULK_PREVIEW_MS and right,
            )
        )
    else:
        out.append((names[0], "not measured", None))
    run = bulk.get("bulk")
    if run:
        seconds = run["seconds"]
        out.append(
            (
                names[1],
                (
                    f"{seconds:,.1f} s ({run['items_per_s']:,.1f} items/s)"
                    if seconds is not None
                    else "not finished"
                )
                + f"; {run['done']:,} of {run['total']:,} done, {run['failed']:,} failed, {run['skipped']:,} skipped",
                seconds is not None
                and seconds < BULK_SECONDS
                and run["done"] == run["total"] == items
                and not run["failed"]
                and not run["skipped"],
            )
        )
    else:
        out.append((names[1], "not measured", None))
    during, before = bulk.get("append_during"), bulk.get("append_before")
    if during:
        out.append(
            (
                names[2],
                f"p99 {during['p99_ms']:,.1f} ms during ({during['count']:,} appends, {during['errors']} errors)"
                + (f"; {before['p99_ms']:,.1f} ms just before, no bulk" if before else ""),
                during["p99_ms"] <= BULK_APPEND_P99_MS and during["errors"] == 0,
            )
        )
    else:
        out.append((names[2], "not measured", None))
    return out


def markdown(bulk: dict[str, Any]) -> list[str]:
    out = [
        "## Bulk decisions",
        "",
        "Bulk decisions by filter at scale (`bench/bulk.py`): N failed runs, each with an open "
        "recovery item of one reason, in one tenant (`seed_bench --tenant --reason`, COPY); the Procfile's web "
        f"line and {bulk.get('workers', 1)} Procfile worker process(es), the bulk's lanes sharing them. "
        "Over HTTP with an operator key: `POST /api/v1/recovery/bulk` with "
        "`preview: true` for that reason (the first, warming up, not counted); the append (record action, 16 "
        "clients, agents of the same tenant) alone for one window; then the same append again and, once its "
        "window has begun, the bulk `close` started with the previewed `expected_count` and "
        "`GET /api/v1/recovery/bulk/{id}` polled until it finished; the append's window ends there. The "
        "bulk's time is the server's (`finished_at - started_at`). Last, a profile: a second bulk of fresh "
        "items decided in the benchmark process by the job's own function (`bulk_advance_chunk`), without "
        "RQ or load, its queries counted and its Python time profiled.",
        "",
    ]
    run = bulk.get("bulk")
    if not run:
        return [*out, "Not measured in this run.", ""]
    preview, before, during = (
        bulk.get("preview", {}),
        bulk.get("append_before", {}),
        bulk.get("append_during", {}),
    )
    seconds = f"{run['seconds']:,.1f} s" if run["seconds"] is not None else "not finished"
    out += [
        f"- seeded: {bulk.get('seed', {}).get('output', '?')}",
        f"- preview ({preview.get('samples', 0)} samples): p50 {preview.get('p50_ms', 0):,.0f} ms, "
        f"p95 {preview.get('p95_ms', 0):,.0f} ms, max {preview.get('max_ms', 0):,.0f} ms; counted "
        f"{preview.get('counts')} of {preview.get('expected')}",
        f"- bulk {run['id']}: {run['status']} in {seconds} ({run['ms_per_item']:,.1f} ms per item; "
        f"seen finished by the poll after {run['observed_s']:,.1f} s; starting it took "
        f"{run['start_request_ms']:,.0f} ms); {run['done']:,} done, {run['failed']:,} failed, "
        f"{run['skipped']:,} skipped of {run['total']:,}"
        + (f"; first refusals {run['errors']}" if run["errors"] else ""),
        f"- the tenant's items afterwards (status/resolution): {bulk.get('database')}",
        f"- append before: {before.get('throughput', 0):,.1f}/s, p50 {before.get('p50_ms', 0):,.1f} ms, "
        f"p99 {before.get('p99_ms', 0):,.1f} ms; during: {during.get('throughput', 0):,.1f}/s, "
        f"p50 {during.get('p50_ms', 0):,.1f} ms, p99 {during.get('p99_ms', 0):,.1f} ms over "
        f"{during.get('window_s', 0):,.0f} s, {during.get('errors', 0)} errors",
    ]
    prof = bulk.get("profile")
    if prof:
        out += [
            f"- profile ({prof['decided']} items in process): {prof['ms_per_item']:,.1f} ms per item, "
            f"{prof['queries_per_item']:.1f} queries per item ({prof['sql_ms_per_item']:,.1f} ms of them in "
            f"PostgreSQL round trips); statements per item: "
            + ", ".join(f"{k} {v}" for k, v in prof["statements_per_item"].items())
            + (
                "; their time per item (ms): "
                + ", ".join(f"{k} {v}" for k, v in prof["sql_ms_per_item_by_statement"].items())
                if prof.get("sql_ms_per_item_by_statement")
                else ""
            ),
            "",
            "| function (cumulative, per item) | calls | ms |",
            "|---|---|---|",
            *[
                f"| `{row['function']}` | {row['calls_per_item']} | {row['ms_per_item']:,.1f} |"
                for row in prof["python_top"]
            ],
        ]
    out.append("")
    return out
