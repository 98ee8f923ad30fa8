"""Dashboard at scale: seed, pick the pages, count their queries, EXPLAIN them.

Query counts and plans come from running each page in-process under
``CaptureQueriesContext`` (the same settings, database and code the web processes use); the
timings come from the web processes over HTTP (see ``bench.run``), which also report their query
counts in the bench-only ``X-Bench-Queries`` header, so the two can be cross-checked.
"""

from __future__ import annotations

import html
import io
import json
import re
import time
from typing import Any
from urllib.parse import urlencode

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


def _client(user: Any) -> Any:
    from django.test import Client

    # The web processes' ALLOWED_HOSTS (production settings) do not include "testserver".
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


def session_cookie(user: Any) -> str:
    """A real session for the operator, as after signing in (the login form itself is not what is
    measured)."""
    client = _client(user)
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
    client = _client(user)
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

    client = _client(user)
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


def _table_rows() -> dict[str, float]:
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

    rows = _table_rows()
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

    client = _client(user)
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
