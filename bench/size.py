"""Proof at size (issue 30, item 5; and item 2's before/after): the ledger with a year of history.

In its own database (``--size-database-url``, default the benchmark database's name + ``_size``):
``size_seed`` writes ``size_actions`` actions (10 million at full size) with their audit events
(~3 per action) over a year, and a sample of the chains is verified. Then, against that:

1. table and index sizes of the tables that grow with traffic;
2. the append (record an action over HTTP) at 1 and 16 clients;
3. the dashboard's pages (queue, inbox, run page of 200 and of 5,000 actions, runs list, insights:
   the metrics page) and the API's list endpoints: p95 over HTTP, queries per page, and an
   EXPLAIN (ANALYZE) of every query, naming each sequential scan of a big table;
4. a governed tool call at one agent: ``run.step`` of the Python client (record with
   ``start: true``, call the tool, succeed) against the same tool called bare;
5. retention, when the archiver (``recovery.archive.runs_archive``) is there: one batch of
   ``archive_batch`` runs (100k) while 16 clients append, then the rest, ``VACUUM FULL``, the
   sizes again and ``verify_audit`` on what is live and what is archived.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bench.loadgen import LoadControl, percentile

if TYPE_CHECKING:
    from bench.run import Harness

# The tables that grow with traffic (issue 30, item 2), and the small ones beside them.
GROWING = (
    "ledger_event",
    "ledger_action",
    "ledger_run",
    "ledger_idempotencyrecord",
    "recovery_notification",
    "recovery_recoveryitem",
    "recovery_approval",
    "ledger_archivedrun",
)
CLIENTS = 16
TENANT = "acme"  # the seeded tenants are acme, globex, initech (bench.dashboard.TENANTS)
RETENTION = "90d"
# Targets (docs/BENCHMARKS.md, issue 30).
PAGE_P95_MS = 100
APPEND_P99_MS = 100
GOVERNED_P50_MS = 10
GOVERNED_P99_MS = 25
SHRINK = 0.70
# The tenant of the append load's agents (its runs are not the seeded year's).
LOAD_TENANT = "bench-size"


def _switch_database(url: str) -> None:
    """Point this process's Django connection at ``url``'s database."""
    from django.db import connections

    conn = connections["default"]
    conn.close()
    conn.settings_dict["NAME"] = urlsplit(url).path.lstrip("/")


def table_sizes() -> dict[str, Any]:
    from django.db import connection

    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        for table in GROWING:
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is None:
                continue
            cursor.execute(
                "SELECT pg_total_relation_size(%s), pg_relation_size(%s), pg_indexes_size(%s), "
                "(SELECT reltuples::bigint FROM pg_class WHERE relname = %s)",
                [table, table, table, table],
            )
            total, heap, indexes, rows = cursor.fetchone()
            cursor.execute(
                "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
                "WHERE x.indrelid = %s::regclass ORDER BY 2 DESC",
                [table],
            )
            out[table] = {
                "total": total,
                "heap": heap,
                "indexes": indexes,
                "rows": max(0, rows),
                "each_index": dict(cursor.fetchall()),
            }
        cursor.execute("SELECT pg_database_size(current_database())")
        out["database"] = cursor.fetchone()[0]
    return out


def _tenants_and_keys() -> list[tuple[int, list[tuple[str, str]]]]:
    from bench import size_seed
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create, tenant_get_or_create

    out = []
    for slug in ("acme", "globex", "initech"):
        tenant = tenant_get_or_create(slug=slug)
        keys = []
        for agent in size_seed.AGENTS:
            issued = agent_key_create(
                tenant=tenant, name=f"size-{agent}", scopes=["agent"], actor=Actor.system("bench")
            )
            keys.append((issued.key.pk, agent))
        out.append((tenant.pk, keys))
    return out


def _operator_key() -> str:
    from ledger.audit import Actor
    from ledger.services.keys import agent_key_create, tenant_get_or_create

    tenant = tenant_get_or_create(slug=TENANT)
    return agent_key_create(
        tenant=tenant, name="size-operator", scopes=["operator"], actor=Actor.system("bench")
    ).secret


def _time_paths(
    h: Harness, pages: list[tuple[str, str]], headers: dict[str, str], samples: int
) -> dict[str, Any]:
    """p50/p95 over HTTP, one client, ``samples`` GETs of each path after two to warm up
    (``bench.reads.page_timings``, each request with ``headers``)."""
    from bench import reads

    return reads.page_timings(
        port=h.port, cookie="", pages=[(name, path, headers) for name, path in pages], samples=samples
    )


def _pages(user: Any, h: Harness) -> list[tuple[str, str]]:
    """The dashboard's pages at this size: ``bench.dashboard``'s, with the run page of 5,000."""
    from bench import dashboard
    from ledger.models import Run

    pages = dashboard.pages(
        user=user, deep_pages=h.sizes.deep_pages, big_run_actions=h.sizes.size_big_runs[0]
    )
    big = (
        Run.objects.filter(action_count=h.sizes.size_big_runs[-1], status="failed")
        .order_by("-created_at")
        .values_list("pk", flat=True)
        .first()
    )
    if big:
        n = h.sizes.size_big_runs[-1]
        pages.insert(6, (f"run detail ({n} actions)", f"/runs/{big}/"))
    return pages


def _api_paths() -> list[tuple[str, str]]:
    from ledger.models import Run

    out = [
        ("API: GET /runs", "/api/v1/runs"),
        ("API: GET /runs?status=failed", "/api/v1/runs?status=failed"),
        ("API: GET /recovery", "/api/v1/recovery"),
    ]
    for run_id, n in (
        Run.objects.filter(tenant__slug=TENANT, action_count__gte=200, status="failed")
        .order_by("action_count")
        .values_list("pk", "action_count")
    ):
        out.append((f"API: GET /runs/{{id}}/actions ({n} actions)", f"/api/v1/runs/{run_id}/actions"))
    return out


def _api_query_counts(secret: str, paths: list[tuple[str, str]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Queries per request and the EXPLAIN of each, in-process (``bench.dashboard``'s way)."""
    from django.db import connection, transaction
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from bench import dashboard

    client = Client(HTTP_HOST="127.0.0.1", headers={"Authorization": f"Bearer {secret}"})
    counts: dict[str, Any] = {}
    captured: dict[str, list[str]] = {}
    for name, path in paths:
        client.get(path)
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(path)
        counts[name] = {"queries": len(ctx.captured_queries), "status": response.status_code}
        captured[name] = [q["sql"] for q in ctx.captured_queries]
    rows = dashboard._table_rows()
    big = {t for t, n in rows.items() if n >= dashboard.BIG_ROWS}
    report: dict[str, Any] = {}
    with transaction.atomic():
        for name, sqls in captured.items():
            report[name] = dashboard.explain_sqls(sqls, big=big)
        transaction.set_rollback(True)
    return counts, report


def governed_call(h: Harness, secret: str, steps: int) -> dict[str, Any]:
    """At one agent: what governance adds to a tool call. Each step is ``run.step`` of the Python
    client (record with ``start: true`` → the tool → succeed, over HTTP); the tool is timed inside
    it, so the difference is what the agent waits for Saga Admin. The same tool called bare is
    timed too."""
    from saga_client import Saga

    def tool(args: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "n": args["n"]}

    bare = []
    for n in range(steps):
        t = time.perf_counter()
        tool({"n": n})
        bare.append(time.perf_counter() - t)
    added: list[float] = []
    total: list[float] = []
    with (
        Saga(f"http://127.0.0.1:{h.port}", secret) as saga,
        saga.run(agent="size-governed", request="the governed tool call, timed") as run,
    ):
        for n in range(steps + 20):
            inner: list[float] = []

            def do(args: dict[str, Any], inner: list[float] = inner) -> dict[str, Any]:
                t = time.perf_counter()
                result = tool(args)
                inner.append(time.perf_counter() - t)
                return result

            t0 = time.perf_counter()
            run.step("bench.governed_call", target=("record", f"r-{n}"), args={"n": n}, do=do)
            elapsed = time.perf_counter() - t0
            if n >= 20:  # the first 20 warm the connection and the web process
                total.append(elapsed)
                added.append(elapsed - inner[0])
    added.sort()
    total.sort()
    bare.sort()
    raw = _raw_pair(h, secret, steps)
    return {
        **raw,
        "steps": len(added),
        "added_p50_ms": percentile(added, 50) * 1000,
        "added_p99_ms": percentile(added, 99) * 1000,
        "step_p50_ms": percentile(total, 50) * 1000,
        "step_p99_ms": percentile(total, 99) * 1000,
        "bare_p50_ms": percentile(bare, 50) * 1000,
        "bare_p99_ms": percentile(bare, 99) * 1000,
    }


def _raw_pair(h: Harness, secret: str, steps: int) -> dict[str, Any]:
    """The same two requests as ``run.step`` (record with ``start: true``, then succeed) sent by a
    bare keep-alive ``httpx.Client``: the server's and the network's part of the governed call,
    without the client library's own work."""
    import httpx

    base = f"http://127.0.0.1:{h.port}/api/v1"
    pairs: list[float] = []
    with httpx.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=30) as client:
        run_id = client.post(f"{base}/runs", json={"agent": "size-raw", "request": "raw pair"}).json()["id"]
        for n in range(steps + 20):
            t0 = time.perf_counter()
            body = {
                "tool": "bench.governed_call",
                "target_type": "record",
                "target_id": f"r-{n}",
                "args": {"n": n},
                "idempotency_key": f"{run_id}:raw:{n}",
                "start": True,
            }
            recorded = client.post(f"{base}/runs/{run_id}/actions", json=body)
            client.post(f"{base}/actions/{recorded.json()['id']}/succeed", json={"result": {"ok": True}})
            if n >= 20:
                pairs.append(time.perf_counter() - t0)
    pairs.sort()
    return {"raw_pair_p50_ms": percentile(pairs, 50) * 1000, "raw_pair_p99_ms": percentile(pairs, 99) * 1000}


def profile_page(user: Any, path: str, top: int = 12) -> dict[str, Any]:
    """One GET of ``path`` in this process under cProfile (after one to warm up): the project's
    functions and the libraries' by their own time, and the SQL's share."""
    import cProfile
    import pstats

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench import dashboard

    client = dashboard._client(user)
    client.get(path)
    profiler = cProfile.Profile()
    with CaptureQueriesContext(connection) as ctx:
        t = time.perf_counter()
        profiler.enable()
        client.get(path)
        profiler.disable()
        elapsed = time.perf_counter() - t
    stats = pstats.Stats(profiler)
    rows = []
    for (file, line, func), (_cc, calls, own, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = file.split("site-packages/")[-1] if "site-packages/" in file else file.rsplit("/wt/", 1)[-1]
        rows.append((own, cumulative, calls, f"{where}:{line} {func}"))
    rows.sort(reverse=True)
    return {
        "ms": elapsed * 1000,
        "sql_ms": sum(float(q["time"]) for q in ctx.captured_queries) * 1000,
        "queries": len(ctx.captured_queries),
        "top_own": [
            {"function": name, "calls": calls, "own_ms": own * 1000, "cumulative_ms": cum * 1000}
            for own, cum, calls, name in rows[:top]
        ],
    }


def _archiver() -> Any:
    """The archiver's entry point (``recovery.archive.runner``), None when it is not in the tree."""
    try:
        from recovery.archive import runner
    except ImportError:
        return None
    return runner if hasattr(runner, "runs_archive") else None


def _configure_retention(h: Harness, archive_url: str) -> None:
    """``audit.retention`` in the global policy document (the bench's policies beside it)."""
    from django.core.management import call_command

    from bench.fixtures import BENCH_POLICIES

    document = {
        **BENCH_POLICIES,
        "audit": {"retention": {"closed_runs": RETENTION, "archive": archive_url}},
    }
    path = h.log_dir / "size-retention-policies.json"
    path.write_text(json.dumps(document, indent=2))
    call_command("load_policies", str(path), verbosity=0, stdout=io.StringIO())


def _outcome(result: Any) -> Any:
    """An ``ArchiveResult`` in a few numbers (its lists name every run)."""
    if not hasattr(result, "archived"):
        return _jsonable(result)
    skipped: dict[str, int] = {}
    for outcome in result.skipped:
        skipped[outcome.detail[:80]] = skipped.get(outcome.detail[:80], 0) + 1
    return {"archived": len(result.archived), "skipped": skipped, "errors": list(result.errors)[:10]}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, default=str)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _archived(result: Any) -> int:
    """How many runs a ``runs_archive`` call moved, whatever shape it answers in (a count, a
    list, a mapping or an object with a count)."""
    if isinstance(result, bool) or result is None:
        return 0
    if isinstance(result, int):
        return result
    if isinstance(result, list | tuple):
        return len(result)
    counts = result if isinstance(result, dict) else getattr(result, "__dict__", {})
    for key in ("archived", "runs", "archived_runs", "count"):
        value = counts.get(key)
        if isinstance(value, int):
            return value
        if isinstance(value, list | tuple):
            return len(value)
    return 0


def _batch_under_append(
    h: Harness, archive: Any, append_params: dict[str, Any], web: Any
) -> tuple[Any, float, Any]:
    """One ``runs_archive`` batch, started once 16 clients' append window has begun; the window
    ends when the batch does. (its result, its seconds, the append's LoadResult)"""
    control = LoadControl()
    loaded: dict[str, Any] = {}
    failure: list[BaseException] = []

    def append_load() -> None:
        try:
            loaded["result"] = h.load(
                "record_action", CLIENTS, append_params, web=web, window_s=7200, control=control
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            failure.append(exc)

    thread = threading.Thread(target=append_load, name="size-append-load", daemon=True)
    thread.start()
    try:
        if not control.wait_window(timeout=300):
            raise RuntimeError("the append load's window did not begin within 300 s")
        t = time.perf_counter()
        result = archive.runs_archive(limit=h.sizes.archive_batch)
        seconds = time.perf_counter() - t
    finally:
        control.stop()
        thread.join(timeout=600)
    if failure:
        raise failure[0]
    return result, seconds, loaded["result"]


def _load_share(sizes: dict[str, Any]) -> dict[str, Any]:
    """The bytes of ``sizes`` that are the append load's own rows (its tenant, ``bench-size``: runs
    it made and wrote to while the batch ran, none of them part of the seeded year): per growing
    table with a tenant, its rows of that tenant times the table's bytes per row."""
    from django.db import connection

    share: dict[str, Any] = {"tables": {}, "bytes": 0}
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM ledger_tenant WHERE slug = %s", [LOAD_TENANT])
        row = cursor.fetchone()
        if row is None:
            return share
        for table in GROWING:
            size = sizes.get(table)
            if not size:
                continue
            cursor.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'tenant_id'",
                [table],
            )
            if cursor.fetchone() is None:
                continue
            cursor.execute(f"SELECT count(*), count(*) FILTER (WHERE tenant_id = %s) FROM {table}", [row[0]])  # noqa: S608
            total, load = cursor.fetchone()
            if total and load:
                part = int(size["total"] * load / total)
                share["tables"][table] = {"rows": load, "of": total, "bytes": part}
                share["bytes"] += part
    return share


def _vacuum_full() -> float:
    from django.db import connection

    t = time.perf_counter()
    with connection.cursor() as cursor:
        for table in GROWING:
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is not None:
                cursor.execute(f"VACUUM (FULL, ANALYZE) {table}")
    return time.perf_counter() - t


def _verify_archived(archive_url: str, key: str) -> dict[str, Any]:
    """Every archive under ``archive_url`` checked offline, as ``verify_audit --archive`` does
    (``ledger.archive.verify``): the runs checked, and the problems found (none: ok)."""
    from ledger.archive.destinations import destination_parse
    from ledger.archive.storage import storage_for
    from ledger.archive.verify import archives_verify

    t = time.perf_counter()
    runs, events = 0, 0
    problems: list[str] = []
    storage = storage_for(destination_parse(archive_url))
    for report in archives_verify(storage, archive_url, key=key.encode()):
        runs += 1
        events += report.events
        problems.extend(f"{report.where}: {problem}" for problem in report.problems[:3])
    return {
        "ok": runs > 0 and not problems,
        "runs": runs,
        "events": events,
        "problems": problems[:20],
        "seconds": time.perf_counter() - t,
    }


def retention(
    h: Harness,
    summarize: Callable[..., dict[str, Any]],
    log: Callable[[str], None],
    keys: list[tuple[str, str]],
    web: Any,
) -> dict[str, Any]:
    """One archive batch under the append, then the rest of retention, VACUUM FULL, verify."""
    archive = _archiver()
    if archive is None:
        return {
            "available": False,
            "note": "archiver not available (recovery.archive.runs_archive is not in this tree)",
        }
    if h.sizes.archive_batch <= 0:
        return {"available": False, "note": "not run in this measurement (--size-archive-batch 0)"}
    from bench import fixtures, size_seed

    # Runs for ~300 appends/s over the batch's expected length (a client that runs out goes on
    # recording into its last run): made only when there is a batch to append beside.
    per_run = 10
    append_params = {
        "runs": fixtures.fresh_runs(
            keys=keys, per_client=int(300 * h.sizes.archive_expected_s / per_run / CLIENTS) + 2
        ),
        "per_run": per_run,
        "headers_per_client": {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(CLIENTS)},
    }

    out: dict[str, Any] = {"available": True, "retention": RETENTION}
    archive_dir = (h.log_dir / "size-archive").resolve()
    archive_dir.mkdir(parents=True, exist_ok=True)
    archive_url = f"file://{archive_dir}"
    # The operator's side of the archive: a key for its signatures and the one destination allowed
    # (in the environment, and in the settings, which read theirs when this process started).
    from django.conf import settings

    key = os.environ.setdefault("SAGA_AUDIT_KEY", "bench-size-audit-key-not-for-production-0123456789abcdef")
    if not getattr(settings, "AUDIT_KEY", ""):
        settings.AUDIT_KEY = key
    os.environ["SAGA_ARCHIVE_ALLOWED_URLS"] = archive_url
    settings.SAGA = {**settings.SAGA, "ARCHIVE_ALLOWED_URLS": [archive_url]}
    _configure_retention(h, archive_url)
    t = time.perf_counter()
    out["dry_run"] = _outcome(archive.runs_archive(dry_run=True))
    out["dry_run_s"] = time.perf_counter() - t
    log(f"size: one archive batch of {h.sizes.archive_batch} runs while {CLIENTS} clients append")
    result, out["batch_s"], during = _batch_under_append(h, archive, append_params, web)
    out["batch_result"], out["batch_runs"] = _outcome(result), _archived(result)
    out["append_during_batch"] = summarize(during, "record_action")
    log(f"size: archive batch took {out['batch_s']:.0f}s; the rest of retention")
    t = time.perf_counter()
    rounds = []
    while time.perf_counter() - t < h.sizes.retention_timeout_s:
        moved = _archived(archive.runs_archive(limit=h.sizes.archive_batch))
        rounds.append(moved)
        if not moved:
            break
    out["rest_rounds"], out["rest_runs"] = len(rounds), sum(rounds)
    out["rest_s"] = time.perf_counter() - t
    out["rest_timed_out"] = bool(rounds and rounds[-1])
    out["sizes_after"] = table_sizes()
    log("size: VACUUM FULL of the growing tables")
    out["vacuum_full_s"] = _vacuum_full()
    out["sizes_after_vacuum"] = table_sizes()
    out["load_share"] = _load_share(out["sizes_after_vacuum"])
    out["verify_live"] = size_seed.check(sample=h.sizes.verify_sample)
    out["verify_archived"] = _verify_archived(archive_url, settings.AUDIT_KEY or key)
    return out


def _seed(h: Harness, url: str, log: Callable[[str], None]) -> dict[str, Any]:
    from django.db import connection

    from bench import size_seed

    sizes = h.sizes
    spec = size_seed.Spec(
        actions=sizes.size_actions,
        workers=h.args.size_workers,
        open_items=sizes.size_open_items,
        pending_approvals=sizes.size_open_items // 4,
        running=sizes.size_open_items // 4,
        big_runs=sizes.size_big_runs,
        tenants=_tenants_and_keys(),
    )
    connection.close()
    log(f"size: seeding {spec.actions:,} actions over {spec.days} days ({spec.workers} COPY streams)")
    out: dict[str, Any] = {"seed": size_seed.seed(url, spec, log=log)}
    log(f"size: seeded in {out['seed']['timings']['total_s']:.0f}s; verifying a sample of the chains")
    out["check"] = size_seed.check(sample=sizes.verify_sample)
    out["sizes_before"] = table_sizes()
    (h.log_dir / "size-seed.json").write_text(json.dumps(out, default=str))
    return out


def _over_http(
    h: Harness,
    summarize: Callable[..., dict[str, Any]],
    log: Callable[[str], None],
    *,
    user: Any,
    secret: str,
    pages: list[tuple[str, str]],
    api: list[tuple[str, str]],
) -> dict[str, Any]:
    """The figures taken over HTTP from the Procfile's web line: pages, API lists, the append,
    the governed call, retention under the append."""
    from bench import dashboard, fixtures

    sizes = h.sizes
    out: dict[str, Any] = {}
    keys = fixtures.agent_keys(tenant_slug=LOAD_TENANT, count=CLIENTS)
    fixtures.load_bench_policies(h.log_dir)
    headers = {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(CLIENTS)}
    per_run = 10
    web = h.start_web("web-size", settings_module="bench.settings")
    try:
        cookie = dashboard.session_cookie(user)
        log("size: dashboard pages and API lists over HTTP, 1 client")
        out["timings"] = _time_paths(h, pages, {"Cookie": cookie}, sizes.page_samples)
        out["api_timings"] = _time_paths(h, api, {"Authorization": f"Bearer {secret}"}, sizes.page_samples)
        for n in (1, CLIENTS):
            log(f"size: append, {n} client(s)")
            runs = fixtures.fresh_runs(
                keys=keys[:n], per_client=int(400 * (sizes.warmup_s + sizes.window_s) / per_run / n) + 2
            )
            params = {
                "runs": runs,
                "per_run": per_run,
                "headers_per_client": {i: headers[i] for i in range(n)},
            }
            out[f"append_{n}"] = summarize(h.load("record_action", n, params, web=web), "record_action")
        log(f"size: a governed tool call at one agent, {sizes.governed_steps} steps")
        out["governed"] = governed_call(h, keys[0][1], sizes.governed_steps)
        out["retention"] = retention(h, summarize, log, keys, web)
    finally:
        web.stop()
    return out


def measure(
    h: Harness, summarize: Callable[..., dict[str, Any]], log: Callable[[str], None]
) -> dict[str, Any]:
    from django.core.management import call_command

    from bench import dashboard
    from bench.run import fresh_database

    out: dict[str, Any] = {}
    url = h.args.size_database_url or f"{h.database_url}_size"
    main_url = h.database_url
    reuse = h.args.size_reuse and (h.log_dir / "size-seed.json").exists()
    if not reuse:
        fresh_database(url)
    h.database_url = url
    _switch_database(url)
    try:
        call_command("migrate", verbosity=0)
        if reuse:
            # A database this phase seeded before (--keep-db): measure it again without the seed.
            log(f"size: reusing the seeded database {urlsplit(url).path.lstrip('/')}")
            out.update(json.loads((h.log_dir / "size-seed.json").read_text()))
            out["sizes_before"] = table_sizes()  # as they are now, before this run's retention
        else:
            out.update(_seed(h, url, log))
        user = dashboard.operator()
        secret = _operator_key()
        pages = _pages(user, h)
        api = _api_paths()
        log("size: queries per page and EXPLAIN (ANALYZE) of each")
        out["queries"] = dashboard.query_counts(user=user, pages=pages)
        out["explain"] = dashboard.explain_pages(user=user, pages=pages)
        out["api_queries"], out["api_explain"] = _api_query_counts(secret, api)

        out.update(_over_http(h, summarize, log, user=user, secret=secret, pages=pages, api=api))
        slow = [(name, t["path"]) for name, t in out["timings"].items() if t["p95_ms"] >= PAGE_P95_MS]
        log(f"size: cProfile of the {len(slow)} page(s) over {PAGE_P95_MS} ms")
        out["profiles"] = {name: profile_page(user, path) for name, path in slow}
    finally:
        from django.db import connections

        connections.close_all()
        h.database_url = main_url
        _switch_database(main_url)
        if not h.args.keep_db:
            from bench.run import drop_database

            drop_database(url)
    return out


# --- Report -------------------------------------------------------------------------------------


def _mb(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:,.0f} MB"


def targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    if not sec:
        return [("at size (10M actions): pages, append, governed call, retention", "not measured", None)]
    for group in ("timings", "api_timings"):
        for name, t in sec.get(group, {}).items():
            out.append(
                (
                    f"at size: {name}: p95 < {PAGE_P95_MS} ms",
                    f"p95 {t['p95_ms']:.1f} ms",
                    t["p95_ms"] < PAGE_P95_MS and not t["errors"],
                )
            )
    for group in ("explain", "api_explain"):
        for name, e in sec.get(group, {}).items():
            out.append(
                (
                    f"at size: {name}: no sequential scan on a growing table",
                    "index scans only"
                    if not e["seq_scans_big"]
                    else "Seq Scan on " + ", ".join(e["seq_scans_big"]),
                    not e["seq_scans_big"],
                )
            )
    g = sec.get("governed")
    if g:
        out.append(
            (
                f"a governed tool call adds ≤ {GOVERNED_P50_MS} ms p50 and ≤ {GOVERNED_P99_MS} ms p99 at one agent",
                f"p50 {g['added_p50_ms']:.1f} ms, p99 {g['added_p99_ms']:.1f} ms",
                g["added_p50_ms"] <= GOVERNED_P50_MS and g["added_p99_ms"] <= GOVERNED_P99_MS,
            )
        )
    ret = sec.get("retention", {})
    during = ret.get("append_during_batch")
    out.append(
        (
            f"append p99 ≤ {APPEND_P99_MS} ms at {CLIENTS} clients while an archive batch runs",
            f"p99 {during['p99_ms']:.1f} ms ({during['errors']} errors)"
            if during
            else ret.get("note", "not measured"),
            (during["p99_ms"] <= APPEND_P99_MS and not during["errors"]) if during else None,
        )
    )
    before = sec.get("sizes_before", {}).get("database")
    after = ret.get("sizes_after_vacuum", {}).get("database")
    if before and after:
        load = int(ret.get("load_share", {}).get("bytes", 0))
        shrink = 1 - (after - load) / before
        live, archived = ret.get("verify_live", {}).get("ok"), ret.get("verify_archived", {}).get("ok")
        out.append(
            (
                f"retention of {RETENTION} on a year shrinks the database by ≥ {SHRINK:.0%}",
                f"{_mb(before)} → {_mb(after)}, of which {_mb(load)} the append load's own rows (written "
                f"during the batch, not the year's): the year's data {_mb(before)} → {_mb(after - load)} ({shrink:.0%})",
                shrink >= SHRINK,
            )
        )
        out.append(
            (
                "verify_audit passes on what is live and what is archived",
                f"live {live}, archived {archived}",
                (live and archived) if archived is not None else None,
            )
        )
    else:
        out.append(
            (
                f"retention of {RETENTION} shrinks the database by ≥ {SHRINK:.0%}; verify_audit passes",
                ret.get("note", "not measured"),
                None,
            )
        )
    return out


def markdown(sec: dict[str, Any]) -> list[str]:
    out = ["## At size", ""]
    if not sec:
        return [*out, "Not measured in this run (`--only size`, or see the failed phases).", ""]
    return [
        *out,
        *_seed_markdown(sec),
        *_load_markdown(sec),
        *_pages_markdown(sec),
        *_where_markdown(sec),
        *_profiles_markdown(sec),
        *_retention_markdown(sec.get("retention", {})),
        "",
    ]


def _seed_markdown(sec: dict[str, Any]) -> list[str]:
    seed = sec.get("seed", {})
    c, tm = seed.get("counts", {}), seed.get("timings", {})
    chk = sec.get("check", {})
    verdict = "pass" if chk.get("ok") else "FAIL " + str(chk.get("problems"))
    return [
        "A year of history in its own database (`bench/size_seed.py`, issue 30 item 5): runs evenly spread "
        "over 365 days, 1 to 60 actions each (mean ~15) plus a failed run of 200 and one of 5,000 actions in "
        "the queue; every run's audit chain (run.created, per action recorded/started/succeeded or failed, "
        "the run's end, its recovery item's events) hashed as `ledger.audit` hashes it; runs of the last "
        "three days running, waiting for approval or failed with an open item. Written by "
        f"{seed.get('workers')} parallel `COPY` streams (no triggers or FK checks during the load, "
        "`synchronous_commit` off), the indexes on random keys built after the load.",
        "",
        f"- seeded {c.get('runs', 0):,} runs, {c.get('actions', 0):,} actions, {c.get('events', 0):,} audit "
        f"events, {c.get('items', 0):,} recovery items, {c.get('approvals', 0):,} pending approvals in "
        f"**{tm.get('total_s', 0) / 60:.1f} min** (COPY {tm.get('copy_s', 0):.0f} s, index builds "
        f"{tm.get('build_indexes_s', 0):.0f} s, VACUUM ANALYZE {tm.get('vacuum_analyze_s', 0):.0f} s)",
        f"- `audit_verify` + `audit_heads_verify` on a sample of {chk.get('runs')} chains ({chk.get('events')} "
        f"events, the big runs' included): {verdict}",
        "",
        "Table and index sizes of the tables that grow with traffic (before retention; after it and "
        "`VACUUM FULL` when the archiver ran):",
        "",
        *_size_table(sec.get("sizes_before", {}), sec.get("retention", {}).get("sizes_after_vacuum")),
        *_index_sizes(sec.get("sizes_before", {})),
    ]


def _index_sizes(sizes: dict[str, Any]) -> list[str]:
    """Each index of the two biggest tables, largest first (issue 30 item 2: indexes stay small)."""
    out = []
    for table in ("ledger_event", "ledger_action"):
        each = sizes.get(table, {}).get("each_index")
        if each:
            out.append(f"- {table}'s indexes: " + ", ".join(f"`{name}` {_mb(n)}" for name, n in each.items()))
    return ["", *out] if out else []


def _load_row(label: str, n: int, a: dict[str, Any]) -> str:
    return (
        f"| {label} | {n} | {a['throughput']:,.0f} | {a['p50_ms']:.1f} | {a['p99_ms']:.1f} | {a['errors']} |"
    )


def _load_markdown(sec: dict[str, Any]) -> list[str]:
    out = [
        "",
        "| figure | clients | throughput /s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|",
    ]
    out += [
        _load_row("append: record action", n, sec[f"append_{n}"])
        for n in (1, CLIENTS)
        if f"append_{n}" in sec
    ]
    during = sec.get("retention", {}).get("append_during_batch")
    if during:
        out.append(_load_row("append while an archive batch runs", CLIENTS, during))
    g = sec.get("governed")
    if g:
        out += [
            "",
            f"A governed tool call at one agent ({g['steps']} steps of the Python client's `run.step`: record "
            "with `start: true`, the tool, succeed, over HTTP): the step takes "
            f"p50 {g['step_p50_ms']:.1f} ms / p99 {g['step_p99_ms']:.1f} ms, the bare tool p50 "
            f"{g['bare_p50_ms']:.3f} ms; **governance adds p50 {g['added_p50_ms']:.1f} ms, p99 "
            f"{g['added_p99_ms']:.1f} ms**. The same two requests from a bare keep-alive `httpx.Client`: "
            f"p50 {g.get('raw_pair_p50_ms', 0):.1f} ms, p99 {g.get('raw_pair_p99_ms', 0):.1f} ms (the server's and "
            "the network's part; the rest is the client library's own work).",
        ]
    return out


def _pages_markdown(sec: dict[str, Any]) -> list[str]:
    out = [
        "",
        "| page / endpoint | p50 ms | p95 ms | queries | seq scans on growing tables | SQL ms (all its queries) |",
        "|---|---|---|---|---|---|",
    ]
    for group, queries, explain in (
        ("timings", "queries", "explain"),
        ("api_timings", "api_queries", "api_explain"),
    ):
        for name, t in sec.get(group, {}).items():
            q = sec.get(queries, {}).get(name, {}).get("queries", "?")
            e = sec.get(explain, {}).get(name, {})
            seq = ", ".join(e.get("seq_scans_big", [])) or "none"
            sql_ms = e.get("total_execution_ms", 0)
            out.append(f"| {name} | {t['p50_ms']:.1f} | {t['p95_ms']:.1f} | {q} | {seq} | {sql_ms:.1f} |")
    return out


def _where_markdown(sec: dict[str, Any]) -> list[str]:
    """The profile behind each target missed: the sequential scans, and for each page over its
    target whether the time is the SQL's or the web process's."""
    out: list[str] = []
    seq_found = [
        (name, q)
        for group in ("explain", "api_explain")
        for name, e in sec.get(group, {}).items()
        for q in e.get("with_seq_scans", [])
    ]
    if seq_found:
        out += ["", "Sequential scans on growing tables (EXPLAIN ANALYZE):", ""]
        for name, q in seq_found:
            sql = " ".join(q["sql"].split())[:400].replace("`", "'")
            scans = ", ".join(q.get("scans", []))
            out.append(f"- **{name}**: {q['execution_ms']:.1f} ms; scans: {scans}; `{sql}`")
    over = [
        (name, t, sec.get(group, {}).get(name, {}))
        for tgroup, group in (("timings", "explain"), ("api_timings", "api_explain"))
        for name, t in sec.get(tgroup, {}).items()
        if t["p95_ms"] >= PAGE_P95_MS
    ]
    if over:
        out += [
            "",
            f"Where the time goes on the pages over {PAGE_P95_MS} ms (p95 against the SQL's own time):",
            "",
        ]
    for name, t, e in over:
        sql_ms = e.get("total_execution_ms", 0)
        main = (e.get("main") or [{}])[0]
        where = (
            "the database; the slowest query"
            if sql_ms >= t["p95_ms"] / 2
            else "the web process (Python: the view and its template), not the database; the slowest query"
        )
        out.append(
            f"- **{name}**: p95 {t['p95_ms']:.0f} ms, SQL {sql_ms:.1f} ms in {e.get('selects', '?')} selects: "
            f"{where} {main.get('execution_ms', 0):.1f} ms ({', '.join(main.get('scans', []))})"
        )
    return out


def _profiles_markdown(sec: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, prof in sec.get("profiles", {}).items():
        out += [
            "",
            f"cProfile of **{name}**, one GET in the benchmark process: {prof['ms']:.0f} ms, of which SQL "
            f"{prof['sql_ms']:.1f} ms in {prof['queries']} queries; the functions with the most own time:",
            "",
            "| function | calls | own ms | cumulative ms |",
            "|---|---|---|---|",
            *[
                f"| `{r['function']}` | {r['calls']:,} | {r['own_ms']:.1f} | {r['cumulative_ms']:.1f} |"
                for r in prof["top_own"]
            ],
        ]
    return out


def _retention_markdown(ret: dict[str, Any]) -> list[str]:
    out = ["", "### Retention", ""]
    if not ret.get("available"):
        return [*out, f"Not measured: {ret.get('note', 'not run')}."]
    return [
        *out,
        f"Policy `audit.retention`: closed runs after {RETENTION}, archived to a local `file://` directory. "
        f"One batch of {ret.get('batch_runs', 0):,} runs in **{ret.get('batch_s', 0):.0f} s** while {CLIENTS} "
        f"clients appended; the rest ({ret.get('rest_runs', 0):,} runs in {ret.get('rest_rounds', 0)} batches) in "
        f"{ret.get('rest_s', 0):.0f} s{' (stopped: time limit)' if ret.get('rest_timed_out') else ''}; "
        f"`VACUUM FULL` of the growing tables {ret.get('vacuum_full_s', 0):.0f} s.",
        f"- batch result: `{str(ret.get('batch_result'))[:300]}`",
        f"- verify live (sample): {ret.get('verify_live')}",
        f"- verify archived: {ret.get('verify_archived')}",
        f"- the append load's own rows after retention (tenant `{LOAD_TENANT}`, not the seeded year's; its "
        f"share of each table's bytes by rows): {ret.get('load_share')}",
    ]


def _size_table(before: dict[str, Any], after: dict[str, Any] | None) -> list[str]:
    head = "| table | rows (planner estimate) | heap | indexes | total |"
    sep = "|---|---|---|---|---|"
    if after:
        head += " rows after | total after |"
        sep += "---|---|"
    out = [head, sep]
    for table in GROWING:
        b = before.get(table)
        if not b:
            continue
        line = f"| {table} | {b['rows']:,} | {_mb(b['heap'])} | {_mb(b['indexes'])} | {_mb(b['total'])} |"
        if after:
            a = after.get(table, {})
            line += f" {a.get('rows', 0):,} | {_mb(a.get('total'))} |"
        out.append(line)
    line = f"| **database** | | | | {_mb(before.get('database'))} |"
    if after:
        line += f" | {_mb(after.get('database'))} |"
    out.append(line)
    return out
