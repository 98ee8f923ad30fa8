"""``make bench``'s reads phase: reads as fast as writes.

On one server (the Procfile's web line, the product's settings), 16 clients each with their own
agent key: the append (record action, fresh runs, ten actions each), then the reads an agent (or
its supervisor) makes, each on a run of its own that the append just filled (ten actions, one
checkpoint): ``GET /runs/{id}/checkpoints``, ``GET /runs/{id}``, ``GET /runs/{id}/actions`` and
``GET /runs`` (the key's newest 50), then the append again, so the two append windows show this
run's drift. Each read's rate is compared with the append's (the mean of the two windows).

Then the dashboard's run page at two lengths of ledger (``seed_bench``'s failed runs of 200 and of
5,000 actions): the page as served and its "Load more" (the htmx request the button sends, for
the page of older actions), each timed over HTTP by one client (``page_timings``) and its queries
counted in-process (``bench.dashboard.query_counts``); the API reads' queries are counted the same
way (``api_query_counts``). The reusable pieces, for any other section that times pages:

- ``measure_pages(port=, user=, pages=, samples=)``: p50/p95 over HTTP and queries per page for a
  list of ``(name, path)`` pages (needs a web server on ``port`` started with ``bench.settings``,
  whose responses carry their query count);
- ``page_timings`` (HTTP only), ``bench.dashboard.query_counts`` (queries only);
- ``run_pages(user=, actions=)``: the run page and its Load more for the seeded run with that many
  actions;
- ``api_query_counts(secret=, paths=)``: queries per API GET, in-process.
"""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

from bench import dashboard, fixtures
from bench.loadgen import percentile, run_load
from bench.stats import log, summarize
from bench.tables import load_row

if TYPE_CHECKING:
    from bench.harness import Harness

CLIENTS = 16
# The ledgers the run page is measured with (the target: "with 200 and with 5,000 actions").
RUN_PAGE_ACTIONS = (200, 5000)
# The API reads compared with the append, in the order measured: (op, label, path template).
API_READS = (
    ("checkpoints", "GET a run's checkpoints", "/api/v1/runs/{run}/checkpoints"),
    ("run", "GET a run", "/api/v1/runs/{run}"),
    ("actions", "GET a run's actions", "/api/v1/runs/{run}/actions"),
    ("runs", "GET the newest runs", "/api/v1/runs?limit=50"),
)
# The targets: every read at least the append's rate (16 clients); every page p95 < 100 ms.
READ_RATIO = 1.0
PAGE_P95_MS = 100


# --- Reusable measurements ----------------------------------------------------------------------


def page_timings(*, port: int, cookie: str, pages: list[Any], samples: int, warm: int = 2) -> dict[str, Any]:
    """Each page fetched ``samples + warm`` times by one client over HTTP (the first ``warm``
    dropped by start time: they warm the worker's caches); p50/p95 of the rest, and the query
    counts the web process reported (``X-Bench-Queries``, ``bench.settings``). A page given as
    ``(name, path, headers)`` sends those headers too (an htmx request, an API key); ``cookie``
    may be "" (no session)."""
    timings: dict[str, Any] = {}
    for page in pages:
        name, path = page[0], page[1]
        headers = {**({"Cookie": cookie} if cookie else {}), **(page[2] if len(page) > 2 else {})}
        result = run_load(
            scenario="get_pages",
            host="127.0.0.1",
            port=port,
            clients=1,
            processes=1,
            warmup_s=0,
            window_s=3600,
            params={"pages": [(name, path)], "max_requests_per_client": samples + warm},
            headers=headers,
        )
        ordered = sorted((x for x in result.samples if x.op == name), key=lambda x: x.started)[warm:]
        lat = sorted(x.latency for x in ordered)
        timings[name] = {
            "path": path,
            "count": len(lat),
            "p50_ms": percentile(lat, 50) * 1000,
            "p95_ms": percentile(lat, 95) * 1000,
            "errors": result.error_count(),
            "error_detail": dict(result.errors),
            "http_queries": sorted(result.queries.get(name, set())),
        }
    return timings


def measure_pages(*, port: int, user: Any, pages: list[Any], samples: int) -> dict[str, Any]:
    """p50/p95 over HTTP (``page_timings``) and the queries each page runs, counted in-process
    (``bench.dashboard.query_counts``), for ``pages`` as ``(name, path[, headers])``; the web
    server on ``port`` must run ``bench.settings``. Returns ``{name: {p50_ms, p95_ms, queries,
    http_queries, bytes, status, ...}}``."""
    timings = page_timings(port=port, cookie=dashboard.session_cookie(user), pages=pages, samples=samples)
    counts = dashboard.query_counts(user=user, pages=pages)
    return {name: {**timings[name], **counts.get(name, {})} for name in timings}


def _load_more_link(body: str) -> tuple[str, str] | None:
    """The run page's Load more (older actions): the URL its htmx button gets and its target."""
    for match in re.finditer(r"<[^>]*hx-get=\"([^\"]+)\"[^>]*>", body):
        tag = match.group(0)
        target = re.search(r'hx-target="#([^"]+)"', tag)
        if target and target.group(1) in ("load-more", "earlier-actions"):
            return html.unescape(match.group(1)), target.group(1)
    return None


def run_pages(*, user: Any, actions: int, deep: int = 10) -> list[Any]:
    """The run page of the newest seeded failed run with ``actions`` actions, its Load more (the
    htmx request, ``deep`` pages in: the operator scrolling back through the ledger) and its
    correction trail (the request the page makes for it once it is up)."""
    from ledger.models import Run

    run_id = (
        Run.objects.filter(tenant__slug__in=dashboard.TENANTS, action_count=actions, status="failed")
        .order_by("-created_at")
        .values_list("pk", flat=True)
        .first()
    )
    if run_id is None:
        return []
    path = f"/runs/{run_id}/"
    out: list[Any] = [(f"run page ({actions:,} actions)", path)]
    trail = re.search(r'hx-get="([^"]*/trail)"', dashboard.client_for(user).get(path).content.decode())
    if trail:
        htmx = {"HX-Request": "true", "HX-Target": "trail-slot"}
        out.append((f"run page ({actions:,} actions): its correction trail (htmx)", trail.group(1), htmx))
    client = dashboard.client_for(user)
    link = _load_more_link(client.get(path).content.decode())
    hops = 0
    while link is not None and hops < deep:
        url, target = link
        headers = {"HX-Request": "true", "HX-Target": target}
        body = client.get(url, headers=headers).content.decode()
        hops += 1
        following = _load_more_link(body)
        if following is None or hops == deep:
            out.append((f"run page ({actions:,} actions): Load more, {hops} in (htmx)", url, headers))
            break
        link = following
    return out


def api_query_counts(*, secret: str, paths: dict[str, str]) -> dict[str, Any]:
    """The queries each API GET runs (in-process, after one warming request), with its status."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {secret}")
    out: dict[str, Any] = {}
    for name, path in paths.items():
        client.get(path)
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(path)
        out[name] = {
            "queries": len(ctx.captured_queries),
            "status": response.status_code,
            "bytes": len(response.content),
        }
    return out


# --- The phase ------------------------------------------------------------------------------------


def _paths(runs: list[str], template: str) -> dict[int, str]:
    return {i: template.format(run=run) for i, run in enumerate(runs)}


def _api(harness: Harness) -> dict[str, Any]:
    from ledger.audit import Actor
    from ledger.models import AgentKey, Run
    from ledger.services.checkpoints import checkpoint_write

    keys = fixtures.agent_keys(tenant_slug="bench-reads", count=CLIENTS)
    fixtures.load_bench_policies(harness.log_dir)
    headers = {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(CLIENTS)}
    per_run = 10
    runs_needed = int(800 * (harness.sizes.warmup_s + harness.sizes.window_s) / per_run / CLIENTS) + 2
    out: dict[str, Any] = {}
    web = harness.start_web("web-reads")
    try:
        log(f"reads: append (record action), {CLIENTS} clients")
        runs = fixtures.fresh_runs(keys=keys, per_client=runs_needed)
        params = {"runs": runs, "per_run": per_run, "headers_per_client": headers}
        out["append"] = summarize(harness.load("record_action", CLIENTS, params, web=web), "record_action")
        # Each client reads the first run it filled: ten actions, and a checkpoint written now.
        read_runs = [client_runs[0] for client_runs in runs]
        for (key_id, _), run_id in zip(keys, read_runs, strict=True):
            key = AgentKey.objects.select_related("tenant").get(pk=key_id)
            checkpoint_write(
                run=Run.objects.get(pk=run_id),
                actor=Actor.for_key(key),
                name="planned",
                state={"step": 1},
                summary="benchmark",
            )
        out["read_runs_actions"] = sorted(
            set(Run.objects.filter(pk__in=read_runs).values_list("action_count", flat=True))
        )
        for op, label, template in API_READS:
            log(f"reads: {label}, {CLIENTS} clients")
            params = {
                "op": op,
                "paths_per_client": _paths(read_runs, template),
                "headers_per_client": headers,
            }
            out[op] = summarize(harness.load("get_path", CLIENTS, params, web=web), op)
        log(f"reads: append again (record action), {CLIENTS} clients")
        runs = fixtures.fresh_runs(keys=keys, per_client=runs_needed)
        params = {"runs": runs, "per_run": per_run, "headers_per_client": headers}
        out["append_again"] = summarize(
            harness.load("record_action", CLIENTS, params, web=web), "record_action"
        )
    finally:
        web.stop()
    out["queries"] = api_query_counts(
        secret=keys[0][1], paths={op: template.format(run=read_runs[0]) for op, _, template in API_READS}
    )
    return out


def _pages(harness: Harness) -> dict[str, Any]:
    user = dashboard.operator()
    seeds = []
    for actions in RUN_PAGE_ACTIONS:
        # A few runs around the big one (the queue's shapes); the big run is a failed run in the
        # queue, the page an operator opens.
        options = dict(
            runs=20,
            actions_per_run=10,
            open_items=5,
            pending_approvals=2,
            resolved_items=2,
            big_runs=1,
            big_run_actions=actions,
            # Nobody has claimed the big run's item: both run pages show the same panels, so
            # their query counts differ only if the ledger's length changed them.
            claimed_share=0,
        )
        log(f"reads: seed_bench {options}")
        seeds.append(dashboard.seed(options))
    pages: list[Any] = []
    for actions in RUN_PAGE_ACTIONS:
        pages += run_pages(user=user, actions=actions)
    web = harness.start_web("web-reads-pages", settings_module="bench.settings")
    try:
        log(f"reads: {len(pages)} run pages over HTTP, 1 client")
        measured = measure_pages(
            port=harness.port, user=user, pages=pages, samples=harness.sizes.page_samples
        )
    finally:
        web.stop()
    return {"seeds": seeds, "pages": measured}


def measure(harness: Harness) -> dict[str, Any]:
    return {"api": _api(harness), **_pages(harness)}


def phase(h: Harness) -> None:
    h.section("reads").update(measure(h))


# --- The report -----------------------------------------------------------------------------------


def _append_rate(api: dict[str, Any]) -> float | None:
    rates = [api[k]["throughput"] for k in ("append", "append_again") if api.get(k, {}).get("throughput")]
    return sum(rates) / len(rates) if rates else None


def rows(sec: dict[str, Any]) -> list[list[str]]:
    api = sec.get("api", {})
    out: list[list[str]] = []
    append = _append_rate(api)
    queries = api.get("queries", {})
    for key, label in (("append", "append: record action"), ("append_again", "append again: record action")):
        if api.get(key):
            out.append(load_row(f"reads: {label} ({CLIENTS} clients)", api[key], "baseline"))
    for op, label, _template in API_READS:
        entry = api.get(op)
        if not entry:
            continue
        note = f"{entry['throughput'] / append:.2f}x the append" if append else "–"
        if op in queries:
            note += f"; {queries[op]['queries']} queries"
        out.append(load_row(f"reads: {label} ({CLIENTS} clients)", entry, note))
    for name, page in sec.get("pages", {}).items():
        out.append(
            [
                f"page: {name}",
                "1",
                "–",
                f"{page['p50_ms']:.1f}",
                f"{page['p95_ms']:.1f}",
                "–",
                str(page["errors"]),
                "–",
                f"{page.get('queries', '?')} queries, {page.get('bytes', 0) / 1024:,.0f} KiB",
            ]
        )
    return out


def targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    api = sec.get("api", {})
    append = _append_rate(api)
    out: list[tuple[str, str, bool | None]] = []
    for op, label, _template in API_READS[:2]:
        name = f"{label} ≥ {READ_RATIO:.1f}x the append rate ({CLIENTS} clients, same server)"
        entry = api.get(op)
        if not (entry and append):
            out.append((name, "not measured", None))
            continue
        ratio = entry["throughput"] / append
        clean = entry["errors"] == 0
        out.append(
            (
                name,
                f"{entry['throughput']:,.0f}/s vs {append:,.0f}/s = {ratio:.2f}x, {entry['errors']} errors",
                ratio >= READ_RATIO and clean,
            )
        )
    pages = sec.get("pages", {})
    for name, page in pages.items():
        out.append(
            (
                f"{name}: p95 < {PAGE_P95_MS} ms",
                f"p95 {page['p95_ms']:.1f} ms, {page['errors']} errors",
                page["p95_ms"] < PAGE_P95_MS and page["errors"] == 0,
            )
        )
    small, big = (
        [p for n, p in pages.items() if n.startswith(f"run page ({a:,} actions)") and "Load more" not in n]
        for a in RUN_PAGE_ACTIONS
    )
    if small and big:
        out.append(
            (
                "run page: queries independent of the ledger's length (200 vs 5,000 actions)",
                f"{small[0].get('queries')} vs {big[0].get('queries')} queries",
                small[0].get("queries") == big[0].get("queries"),
            )
        )
    return out


def markdown(sec: dict[str, Any]) -> list[str]:
    api = sec.get("api", {})
    out = [
        "",
        "## Reads",
        "",
        "Reads as fast as writes (`bench/reads.py`): the Procfile's web line serving the product's settings, 16 "
        "clients, each an agent with its own key. The append (record action, fresh runs, ten actions each), "
        "then each read on a run of the client's own that the append filled (ten actions, one checkpoint): "
        + ", ".join(f"`{template.split('/api/v1', 1)[1]}`" for _, _, template in API_READS)
        + ", then the append again; reads are compared with the mean of the two append windows. Queries "
        "per request are counted in-process (after one warming request). The run page: `seed_bench`'s failed "
        "runs of "
        + " and ".join(f"{a:,}" for a in RUN_PAGE_ACTIONS)
        + " actions, as a logged-in operator, the page as served and its Load more (the htmx request of "
        "the button, ten pages back), one client over HTTP (`bench.settings`, so each response carries its "
        "query count), the first two fetches dropped.",
        "",
    ]
    if not api and not sec.get("pages"):
        return [*out, "Not measured in this run.", ""]
    queries = api.get("queries", {})
    for key in ("append", *(op for op, _, _ in API_READS), "append_again"):
        e = api.get(key)
        if not e:
            continue
        q = f", {queries[key]['queries']} queries, {queries[key]['bytes']:,} bytes" if key in queries else ""
        out.append(
            f"- {key}: {e['count']:,} in {e['window_s']:.0f} s, {e['throughput']:,.1f}/s, p50 {e['p50_ms']:.1f} ms, "
            f"p99 {e['p99_ms']:.1f} ms, server CPU {(e.get('server_cpu_ms_per_request') or 0):.2f} ms/request, "
            f"errors {e['errors']}{q}"
        )
    for seed in sec.get("seeds", []):
        out.append(f"- {seed.get('output', '')}")
    pages = sec.get("pages", {})
    if pages:
        out += [
            "",
            "| page | URL | p50 ms | p95 ms | queries | http | KiB | errors |",
            "|---|---|---|---|---|---|---|---|",
            *[
                f"| {name} | `{p['path']}` | {p['p50_ms']:.1f} | {p['p95_ms']:.1f} | {p.get('queries', '?')} | "
                f"{p['http_queries']} | {p.get('bytes', 0) / 1024:,.0f} | {p['errors']} |"
                for name, p in pages.items()
            ],
        ]
    out.append("")
    return out
