"""The "At size" section of the report (bench/size.py measures it): its targets and its Markdown."""

from __future__ import annotations

from typing import Any

from bench.size_world import CLIENTS, GROWING, LOAD_TENANT, RETENTION

# Targets (docs/BENCHMARKS.md).
PAGE_P95_MS = 100
APPEND_P99_MS = 100
GOVERNED_P50_MS = 10
GOVERNED_P99_MS = 25
SHRINK = 0.70


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
        "A year of history in its own database (`bench/size_seed.py`): runs evenly spread "
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
    """Each index of the two biggest tables, largest first (indexes stay small)."""
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
