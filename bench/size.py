"""Proof at size (and the growing tables' before/after): the ledger with a year of history.

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

import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bench import dashboard, fixtures, reads
from bench.databases import drop_database, fresh_database
from bench.loadgen import percentile
from bench.size_report import PAGE_P95_MS
from bench.size_retention import retention
from bench.size_world import (
    CLIENTS,
    LOAD_TENANT,
    TENANT,
    operator_key,
    switch_database,
    table_sizes,
    tenants_and_keys,
)
from bench.stats import log, summarize

if TYPE_CHECKING:
    from bench.harness import Harness


def _time_paths(
    h: Harness, pages: list[tuple[str, str]], headers: dict[str, str], samples: int
) -> dict[str, Any]:
    """p50/p95 over HTTP, one client, ``samples`` GETs of each path after two to warm up
    (``bench.reads.page_timings``, each request with ``headers``)."""
    return reads.page_timings(
        port=h.port, cookie="", pages=[(name, path, headers) for name, path in pages], samples=samples
    )


def _pages(user: Any, h: Harness) -> list[tuple[str, str]]:
    """The dashboard's pages at this size: ``bench.dashboard``'s, with the run page of 5,000."""
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

    client = Client(HTTP_HOST="127.0.0.1", headers={"Authorization": f"Bearer {secret}"})
    counts: dict[str, Any] = {}
    captured: dict[str, list[str]] = {}
    for name, path in paths:
        client.get(path)
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(path)
        counts[name] = {"queries": len(ctx.captured_queries), "status": response.status_code}
        captured[name] = [q["sql"] for q in ctx.captured_queries]
    rows = dashboard.table_rows()
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

    client = dashboard.client_for(user)
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


def _seed(h: Harness, url: str) -> dict[str, Any]:
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
        tenants=tenants_and_keys(),
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
    *,
    user: Any,
    secret: str,
    pages: list[tuple[str, str]],
    api: list[tuple[str, str]],
) -> dict[str, Any]:
    """The figures taken over HTTP from the Procfile's web line: pages, API lists, the append,
    the governed call, retention under the append."""
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
        out["retention"] = retention(h, keys, web)
    finally:
        web.stop()
    return out


def measure(h: Harness) -> dict[str, Any]:
    from django.core.management import call_command

    out: dict[str, Any] = {}
    url = h.args.size_database_url or f"{h.database_url}_size"
    main_url = h.database_url
    reuse = h.args.size_reuse and (h.log_dir / "size-seed.json").exists()
    if not reuse:
        fresh_database(url)
    h.database_url = url
    switch_database(url)
    try:
        call_command("migrate", verbosity=0)
        if reuse:
            # A database this phase seeded before (--keep-db): measure it again without the seed.
            log(f"size: reusing the seeded database {urlsplit(url).path.lstrip('/')}")
            out.update(json.loads((h.log_dir / "size-seed.json").read_text()))
            out["sizes_before"] = table_sizes()  # as they are now, before this run's retention
        else:
            out.update(_seed(h, url))
        user = dashboard.operator()
        secret = operator_key()
        pages = _pages(user, h)
        api = _api_paths()
        log("size: queries per page and EXPLAIN (ANALYZE) of each")
        out["queries"] = dashboard.query_counts(user=user, pages=pages)
        out["explain"] = dashboard.explain_pages(user=user, pages=pages)
        out["api_queries"], out["api_explain"] = _api_query_counts(secret, api)

        out.update(_over_http(h, user=user, secret=secret, pages=pages, api=api))
        slow = [(name, t["path"]) for name, t in out["timings"].items() if t["p95_ms"] >= PAGE_P95_MS]
        log(f"size: cProfile of the {len(slow)} page(s) over {PAGE_P95_MS} ms")
        out["profiles"] = {name: profile_page(user, path) for name, path in slow}
    finally:
        from django.db import connections

        connections.close_all()
        h.database_url = main_url
        switch_database(main_url)
        if not h.args.keep_db:
            drop_database(url)
    return out


def phase(h: Harness) -> None:
    h.section("size").update(measure(h))
