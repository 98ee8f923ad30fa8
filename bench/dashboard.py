"""``make bench``'s dashboard phase: seed, pick the pages, count their queries, EXPLAIN them, time
them over HTTP.

Query counts and plans come from running each page in-process under
``CaptureQueriesContext`` (the same settings, database and code the web processes use); the
timings come from the web processes over HTTP (``phase``), which also report their query
counts in the bench-only ``X-Bench-Queries`` header, so the two can be cross-checked. The pieces
(``operator``, ``seed``, ``pages``, ``query_counts``, ``explain_pages``, ``session_cookie``) serve
the reads and the size phases too.
"""

from __future__ import annotations

import html
import io
import json
import re
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from bench.loadgen import percentile, run_load
from bench.stats import log
from bench.tables import fmt, short_sql

if TYPE_CHECKING:
    from bench.harness import Harness

OPERATOR = "bench-operator"
OPERATOR_PASSWORD = "Correct-Horse-Battery-7"  # noqa: S105 - a throwaway bench database
TENANTS = ("acme", "globex", "initech")
# What an operator types during an incident: part of a tool or agent name ("the billing ones").
SEARCH_TERM = "billing"
# The ledger's tables: a sequential scan over one of these is a finding once the table is big
# (below BIG_ROWS the planner rightly prefers reading a few pages to an index; such scans are
# listed as information, since they turn into index scans as the table grows).
LEDGER_TABLES = {
    "ledger_run",
    "ledger_action",
    "ledger_event",
    "recovery_recoveryitem",
    "recovery_approval",
    "recovery_unwind",
    "recovery_unwindstep",
    "ledger_checkpoint",
    "django_session",
}
BIG_ROWS = 10_000
# The indexes `make bench` added (new migrations); the EXPLAIN pass is repeated without them, in
# a rolled-back transaction, so their effect is measured in the same run.
BENCH_INDEXES = [
    "recovery_unresolved_newest",
    "recovery_approval_pending_created",
    "recovery_approval_pending_run",
    "action_failed_recent",
    "recovery_unresolved_search",
    "recovery_unresolved_groups",
    "run_newest",
    "run_search_trgm",
]


def operator() -> Any:
    """An operator in all three seeded tenants (the widest queue an operator can have)."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from ledger.services.keys import tenant_get_or_create

    for slug in TENANTS:
        tenant_get_or_create(slug=slug)
        call_command(
            "create_staff",
            OPERATOR,
            password=OPERATOR_PASSWORD,
            tenant=slug,
            role="operator",
            stdout=io.StringIO(),
        )
    return get_user_model().objects.get(username=OPERATOR)


def seed(options: dict[str, int]) -> dict[str, Any]:
    from django.core.management import call_command

    out = io.StringIO()
    started = time.perf_counter()
    call_command("seed_bench", stdout=out, **options)
    return {"seconds": time.perf_counter() - started, "output": out.getvalue().strip(), "options": options}


def table_sizes() -> dict[str, int]:
    from django.db import connection

    sizes = {}
    with connection.cursor() as cursor:
        for table in (
            "ledger_run",
            "ledger_action",
            "recovery_recoveryitem",
            "recovery_approval",
            "ledger_event",
        ):
            cursor.execute(f"SELECT count(*) FROM {table}")  # noqa: S608 - fixed names; once, not per page
            sizes[table] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM recovery_recoveryitem WHERE status <> 'resolved'")
        sizes["open_items"] = cursor.fetchone()[0]
        cursor.execute("SELECT count(*) FROM recovery_approval WHERE status = 'pending'")
        sizes["pending_approvals"] = cursor.fetchone()[0]
    return sizes


def client_for(user: Any) -> Any:
    from django.test import Client

    # The web processes' ALLOWED_HOSTS (production settings) do not include "testserver".
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


def session_cookie(user: Any) -> str:
    """A real session for the operator, as after signing in (the login form itself is not what is
    measured)."""
    client = client_for(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def _url(name: str, fallback: str, **kwargs: Any) -> str:
    from django.urls import NoReverseMatch, reverse

    try:
        return reverse(name, kwargs=kwargs or None)
    except NoReverseMatch:
        return fallback.format(**kwargs)


def _next_cursor_link(body: str) -> str | None:
    # The queue's "next page" link carries a keyset cursor; take the last cursor link on the page.
    links = re.findall(r'href="([^"]*[?&]cursor=[^"]+)"', body)
    return html.unescape(links[-1]) if links else None


def pages(*, user: Any, deep_pages: int, big_run_actions: int) -> list[tuple[str, str]]:
    """The pages an operator opens during an incident, as concrete URLs for this data."""
    from ledger.models import Run

    queue = _url("dashboard:queue", "/")
    client = client_for(user)
    deep = queue
    for _ in range(deep_pages):
        response = client.get(deep)
        link = _next_cursor_link(response.content.decode())
        if link is None:
            break
        deep = link if link.startswith("/") else f"{queue}{link}"
    big_run = (
        Run.objects.filter(tenant__slug__in=TENANTS, action_count=big_run_actions, status="failed")
        .order_by("-created_at")
        .values_list("pk", flat=True)
        .first()
    )
    # Search for what an operator would paste: a tool name from an error message.
    out = [
        ("queue: first page", queue),
        ("queue: filtered (high risk, failed)", f"{queue}?{urlencode({'risk': 'high', 'reason': 'failed'})}"),
        (f"queue: search ({SEARCH_TERM!r})", f"{queue}?{urlencode({'q': SEARCH_TERM})}"),
        (f"queue: deep keyset page ({deep_pages} pages in)", deep),
    ]
    if big_run:
        run_page = _url("dashboard:run-detail", "/runs/{run_id}/", run_id=big_run)
        # The page renders the newest actions and loads the earlier ones on demand; the second
        # figure is every action rendered at once (?actions=all, the no-JavaScript path).
        out += [
            (f"run detail ({big_run_actions} actions)", run_page),
            (f"run detail ({big_run_actions} actions, all rendered)", f"{run_page}?actions=all"),
        ]
    runs = _url("dashboard:runs", "/runs/")
    out += [
        ("runs: first page", runs),
        (f"runs: search ({SEARCH_TERM!r})", f"{runs}?{urlencode({'q': SEARCH_TERM})}"),
        ("runs: failed", f"{runs}?{urlencode({'status': 'failed'})}"),
    ]
    out += [
        ("approval inbox", _url("dashboard:approvals", "/approvals/")),
        ("insights", _url("dashboard:insights", "/insights/")),
    ]
    return out


def query_counts(*, user: Any, pages: list[Any]) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = client_for(user)
    out = {}
    for page in pages:
        # (name, path) or (name, path, headers): an htmx request sends its headers.
        name, path, headers = page[0], page[1], (page[2] if len(page) > 2 else {})
        client.get(path, headers=headers)  # warm: first-request work (session, caches) is not the page's
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(path, headers=headers)
        out[name] = {
            "queries": len(ctx.captured_queries),
            "status": response.status_code,
            "bytes": len(response.content),
        }
    return out


def _walk(plan: dict[str, Any], out: list[dict[str, Any]]) -> None:
    out.append(
        {
            k: plan.get(k)
            for k in (
                "Node Type",
                "Relation Name",
                "Index Name",
                "Actual Rows",
                "Actual Total Time",
                "Rows Removed by Filter",
            )
            if k in plan
        }
    )
    for child in plan.get("Plans", []) or []:
        _walk(child, out)


def table_rows() -> dict[str, float]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, reltuples FROM pg_class WHERE relkind = 'r' AND relname = ANY(%s)",
            [sorted(LEDGER_TABLES)],
        )
        return dict(cursor.fetchall())


def explain_pages(
    *, user: Any, pages: list[tuple[str, str]], without: list[str] | None = None
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) every SELECT each page runs; flag sequential scans over big
    ledger tables. Only SELECTs are analysed: ANALYZE executes the statement. With ``without``,
    those indexes are dropped first inside a transaction that is rolled back."""
    from django.db import connection, transaction

    rows = table_rows()
    big = {t for t, n in rows.items() if n >= BIG_ROWS}
    with transaction.atomic():
        if without:
            with connection.cursor() as cursor:
                for name in without:
                    cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
        report = _explain(user=user, pages=pages, big=big)
        transaction.set_rollback(True)
    return report


def _explain(*, user: Any, pages: list[tuple[str, str]], big: set[str]) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = client_for(user)
    report: dict[str, Any] = {}
    for name, path in pages:
        client.get(path)
        with CaptureQueriesContext(connection) as ctx:
            client.get(path)
        report[name] = explain_sqls([captured["sql"] for captured in ctx.captured_queries], big=big)
    return report


def explain_sqls(sqls: list[str], *, big: set[str]) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) each SELECT of ``sqls`` (what one page or request ran); the
    sequential scans over ``big`` tables are the findings."""
    from django.db import connection

    queries = []
    for sql in sqls:
        if not sql.lstrip().upper().startswith("SELECT"):
            continue
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
            raw = cursor.fetchone()[0]
        plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
        nodes: list[dict[str, Any]] = []
        _walk(plan["Plan"], nodes)
        seq = {n["Relation Name"] for n in nodes if n.get("Node Type") == "Seq Scan"}
        queries.append(
            {
                "sql": sql,
                "execution_ms": plan.get("Execution Time", 0.0),
                "planning_ms": plan.get("Planning Time", 0.0),
                "seq_scans_big": sorted(seq & big),
                "seq_scans_small": sorted((seq & LEDGER_TABLES) - big),
                "scans": sorted(
                    {
                        f"{n['Node Type']} {n.get('Relation Name', '')} {n.get('Index Name', '')}".strip()
                        for n in nodes
                        if "Scan" in n.get("Node Type", "")
                    }
                ),
            }
        )
    queries.sort(key=lambda q: q["execution_ms"], reverse=True)
    return {
        "selects": len(queries),
        "seq_scans_big": sorted({t for q in queries for t in q["seq_scans_big"]}),
        "seq_scans_small": sorted({t for q in queries for t in q["seq_scans_small"]}),
        "total_execution_ms": sum(q["execution_ms"] for q in queries),
        # The slowest few are the page's main queries; keep their plans' scan summary.
        "main": [{**q, "sql": q["sql"][:600]} for q in queries[:3]],
        "with_seq_scans": [{**q, "sql": q["sql"][:600]} for q in queries if q["seq_scans_big"]],
    }


# --- The phase ------------------------------------------------------------------------------


def phase(h: Harness) -> None:
    s = h.section("dashboard")
    sizes = h.sizes
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
    user = operator()
    log(f"seed_bench (small): {seed_small}")
    s["seed_small"] = seed(seed_small)
    pages_small = pages(user=user, deep_pages=sizes.deep_pages, big_run_actions=sizes.big_run_actions)
    s["queries_small"] = query_counts(user=user, pages=pages_small)
    log(f"seed_bench (rest): {seed_rest}")
    s["seed_full"] = seed(seed_rest)
    s["data"] = table_sizes()
    pages_full = pages(user=user, deep_pages=sizes.deep_pages, big_run_actions=sizes.big_run_actions)
    s["pages"] = {name: path for name, path in pages_full}
    s["queries_full"] = query_counts(user=user, pages=pages_full)
    log("EXPLAIN ANALYZE of every query the pages run")
    s["explain"] = explain_pages(user=user, pages=pages_full)
    # Before/after for the indexes this harness's findings added (same data, same run).
    s["explain_without_bench_indexes"] = explain_pages(user=user, pages=pages_full, without=BENCH_INDEXES)
    cookie = session_cookie(user)
    web = h.start_web("web-dashboard", settings_module="bench.settings")
    try:
        log("dashboard pages over HTTP, 1 client")
        timings: dict[str, Any] = {}
        for name, path in pages_full:
            result = run_load(
                scenario="get_pages",
                host="127.0.0.1",
                port=h.port,
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


# --- The report -----------------------------------------------------------------------------


def rows(dash: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, t in dash.get("timings", {}).items():
        q_small = dash.get("queries_small", {}).get(name, {}).get("queries")
        q_full = dash.get("queries_full", {}).get(name, {}).get("queries")
        rows.append(
            [
                f"page: {name}",
                "1",
                "–",
                fmt(t.get("p50_ms"), 1),
                fmt(t.get("p95_ms"), 1),
                "–",
                fmt(t.get("errors")),
                f"{fmt(q_full)} queries (small data: {fmt(q_small)})",
            ]
        )
    return rows


def targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    dash = sec.get("dashboard", {})
    timings = dash.get("timings", {})
    if timings:
        for name, t in timings.items():
            out.append(
                (f"{name}: p95 < 150 ms", f"p95 {t['p95_ms']:.1f} ms", t["p95_ms"] < 150 and not t["errors"])
            )
        small, full = dash.get("queries_small", {}), dash.get("queries_full", {})
        for name in timings:
            qs, qf = small.get(name, {}).get("queries"), full.get(name, {}).get("queries")
            out.append(
                (
                    f"{name}: query count independent of data size",
                    f"{qs} queries at {dash.get('seed_small', {}).get('options', {}).get('runs', '?')} runs, "
                    f"{qf} at full size",
                    qs == qf and qs is not None,
                )
            )
        for name, e in dash.get("explain", {}).items():
            out.append(
                (
                    f"{name}: no sequential scan over the ledger tables",
                    "index scans only"
                    if not e["seq_scans_big"]
                    else "Seq Scan on " + ", ".join(e["seq_scans_big"]),
                    not e["seq_scans_big"],
                )
            )
    else:
        out.append(
            (
                "pages p95 < 150 ms, query counts independent of size, EXPLAIN uses indexes",
                "not measured",
                None,
            )
        )
    return out


def markdown(sec: dict[str, Any]) -> list[str]:
    dash = sec.get("dashboard", {})
    out = [
        "",
        "## Dashboard",
        "",
        "Filled with `manage.py seed_bench` (COPY) in two steps, so query counts are compared at two data sizes "
        "in the same run; pages fetched over HTTP by one client as a logged-in operator of the three seeded "
        "tenants (first two fetches of each page dropped as warm-up). Query counts come from running each "
        "page in-process under `CaptureQueriesContext`; the web processes report theirs in a bench-only "
        "header (`bench.settings`), shown as *http*.",
        "",
    ]
    if dash:
        for key in ("seed_small", "seed_full"):
            if key in dash:
                out.append(f"- {key}: {dash[key]['output']} ({dash[key]['seconds']:.1f} s wall)")
        if "data" in dash:
            out.append("- rows: " + ", ".join(f"{k} {v:,}" for k, v in dash["data"].items()))
        out.append("")
        out.append("| page | URL | p50 ms | p95 ms | queries (small → full) | http | errors |")
        out.append("|---|---|---|---|---|---|---|")
        for name, t in dash.get("timings", {}).items():
            qs = dash.get("queries_small", {}).get(name, {}).get("queries")
            qf = dash.get("queries_full", {}).get(name, {}).get("queries")
            out.append(
                f"| {name} | `{dash.get('pages', {}).get(name, '')}` | {t['p50_ms']:.1f} | {t['p95_ms']:.1f} | "
                f"{qs} → {qf} | {t.get('http_queries')} | {t['errors']} |"
            )
        out += ["", "### EXPLAIN (ANALYZE) of the pages' queries", ""]
        before = dash.get("explain_without_bench_indexes", {})
        for name, e in dash.get("explain", {}).items():
            seq = ", ".join(e["seq_scans_big"]) or "none"
            small = ", ".join(e.get("seq_scans_small", [])) or "none"
            out.append(
                f"**{name}** — {e['selects']} SELECTs, {e['total_execution_ms']:.1f} ms executing in total; "
                f"sequential scans over big ledger tables: {seq} (over small ones, the planner's choice: {small})"
            )
            b = before.get(name)
            if b:
                out.append("")
                out.append(
                    "*Before* the benchmark-motivated indexes "
                    f"({', '.join(f'`{i}`' for i in BENCH_INDEXES)}; same data, dropped in a rolled-back "
                    f"transaction): {b['total_execution_ms']:.1f} ms; sequential scans over big tables: "
                    f"{', '.join(b['seq_scans_big']) or 'none'}"
                )
            out.append("")
            for q in e["main"]:
                out.append(f"- {q['execution_ms']:.2f} ms: {', '.join(q['scans']) or 'no table scan'}")
                out.append(f"  `{short_sql(q['sql'])}`")
            out.append("")
    return out
