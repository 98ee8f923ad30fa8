"""One table for the terminal, one Markdown page for docs/BENCHMARKS.md, from the same results:
the sections in the order the page shows them, each rendered by its phase's module (its rows of
the one table, its targets, its Markdown), with the title, the machine and the closing notes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import (
    append,
    audit_stream,
    baselines,
    bulk,
    dashboard,
    images,
    reads,
    record_size,
    refusals,
    scale,
    servers,
    size_report,
    soak_report,
    tracing,
    unwinds,
)
from bench.tables import HEADER, mark, md_table, procfile_line, text_table

SECTIONS = (
    "Machine",
    "Baselines",
    "Ledger append",
    "Traces",
    "Unauthenticated requests",
    "Record size",
    "Dashboard",
    "Reads",
    "Unwind",
    "Before-images",
    "Servers",
    "Workers scale-out",
    "Bulk decisions",
    "At size",
    "Soak",
    "Targets",
)


def _rows(results: dict[str, Any]) -> list[list[str]]:
    """The one table: every figure with its ratio to the machine's limit."""
    sec = results.get("sections", {})
    base = sec.get("baselines", {})
    rows = [
        *baselines.rows(base),
        *append.rows(sec.get("append", {}), base),
        *tracing.rows(sec.get("traces", {})),
        *record_size.rows(sec.get("record_size", {})),
        *audit_stream.rows(sec.get("audit_stream", {}), base),
        *refusals.rows(sec.get("unauthenticated", {})),
        *dashboard.rows(sec.get("dashboard", {})),
        *reads.rows(sec.get("reads", {})),
        *unwinds.rows(sec.get("unwind", {}), base),
        *images.rows(sec.get("images", {})),
        *servers.rows(sec.get("servers", {}), base),
        *scale.rows(sec.get("workers", {})),
        *bulk.rows(sec.get("bulk", {})),
        *soak_report.rows(sec.get("soak", {})),
    ]
    # Rows without a server-CPU figure get a dash in that column.
    return [r if len(r) == len(HEADER) else [*r[:7], "–", *r[7:]] for r in rows]


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met?) — None when the figure could not be measured."""
    sec = results.get("sections", {})
    base = sec.get("baselines", {})
    return [
        *append.targets(sec, base),
        *tracing.targets(sec.get("traces", {}), sec.get("append", {})),
        *record_size.targets(sec),
        *refusals.targets(sec),
        *dashboard.targets(sec),
        *reads.targets(sec.get("reads", {})),
        *unwinds.targets(sec, base),
        *servers.targets(results),
        *scale.targets(sec.get("workers", {})),
        *bulk.targets(sec.get("bulk", {})),
        *size_report.targets(sec.get("size", {})),
        *soak_report.targets(sec.get("soak", {})),
    ]


def render(results: dict[str, Any], *, smoke: bool) -> tuple[str, str]:
    rows = _rows(results)
    goals = targets(results)
    text = (
        text_table(rows, HEADER)
        + "\n\nTargets:\n"
        + "\n".join(f"  [{mark(met)}] {name}: {value}" for name, value, met in goals)
    )
    if results.get("errors"):
        text += "\n\nPhases that failed:\n" + "\n".join(
            f"  {e['phase']}: {e['error']}" for e in results["errors"]
        )
    return text, _markdown(results, rows, goals, smoke=smoke)


def _markdown(
    results: dict[str, Any], rows: list[list[str]], goals: list[tuple[str, str, bool | None]], *, smoke: bool
) -> str:
    sec = results.get("sections", {})
    base = sec.get("baselines", {})
    return "\n".join(
        [
            *_intro_markdown(results, rows, goals, smoke=smoke),
            *baselines.markdown(base),
            *append.markdown(sec),
            *tracing.markdown(sec.get("traces", {})),
            *refusals.markdown(sec),
            *record_size.markdown(sec),
            *dashboard.markdown(sec),
            *reads.markdown(sec.get("reads", {})),
            *unwinds.markdown(sec, base),
            *images.markdown(sec.get("images", {})),
            *servers.markdown(sec.get("servers", {}), base),
            *scale.markdown(sec.get("workers", {})),
            *bulk.markdown(sec.get("bulk", {})),
            *size_report.markdown(sec.get("size", {})),
            *soak_report.markdown(sec.get("soak", {})),
            *_closing_markdown(results),
        ]
    )


def _intro_markdown(
    results: dict[str, Any], rows: list[list[str]], goals: list[tuple[str, str, bool | None]], *, smoke: bool
) -> list[str]:
    """The title, the machine, the one table, the targets and what the baselines are."""
    m = results.get("machine", {})
    base = results.get("sections", {}).get("baselines", {})
    out = ["# Benchmarks", ""]
    if smoke:
        out += [
            "> **Smoke run** (tiny sizes, to prove the harness works): the figures below say nothing about "
            "performance. `make bench` writes the real ones.",
            "",
        ]
    out += [
        "Written by `make bench` (`python -m bench.run`); every figure below was measured in the same run, on "
        "the machine described here, against the physical limits of that machine (L1–L3) measured minutes "
        "before. Re-run it rather than editing this file.",
        "",
        "## Machine",
        "",
        f"- {m.get('nproc')} CPUs ({m.get('cpu_model')}), {m.get('memory_gib')} GiB memory, Linux {m.get('kernel')}",
        f"- Python {m.get('python')}, Django {m.get('django')}, django-ninja {m.get('django_ninja')}, "
        f"gunicorn {m.get('gunicorn')}, granian {m.get('granian')}, psycopg {m.get('psycopg')}",
        f"- PostgreSQL {m.get('postgresql')} ({', '.join(f'{k}={v}' for k, v in m.get('postgresql_settings', {}).items())})",
        f"- Redis {m.get('redis')}, rq {m.get('rq')}, django-rq {m.get('django_rq')}; "
        f"worker class `{base.get('L3_worker_class', '?')}`",
        f"- commit {m.get('git_commit')}; load average before {m.get('load_before')}, after "
        f"{results.get('load_after')}; whole run {results.get('elapsed_s', 0):.0f} s",
        "- load average (1, 5, 15 min) at the start of each phase: "
        + ", ".join(f"{k} {v}" for k, v in results.get("load", {}).items())
        + " — other work on this shared 2-core machine competes with every figure; compare runs at similar load",
        f"- web: the Procfile's line when measured, `{procfile_line('web', results)}`; worker: "
        f"`{procfile_line('worker', results)}`",
        "",
        "Load generator (L2 and every HTTP figure): 4 client processes (spawned), one thread and one keep-alive "
        "`http.client` connection per client, reconnecting when the server closes; a warm-up is discarded, "
        "then requests that start inside the measurement window count. It runs on the same 2 cores as the "
        "server and PostgreSQL; its own CPU time is reported.",
        "",
        "## Results",
        "",
        md_table(rows, HEADER),
        "",
        "## Targets",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *[f"| {n} | {v.replace('|', '/')} | {mark(met)} |" for n, v, met in goals],
        "",
        "## Baselines",
        "",
        "- **L1**: one `INSERT` of a ledger-shaped row (`CREATE TABLE … (LIKE ledger_action INCLUDING ALL)`: "
        "same columns, indexes and checks, no foreign keys) per transaction, autocommit, "
        "`synchronous_commit` as configured; one connection per client thread.",
        "- **L2**: `bench/noop_wsgi.py` (reads the body, answers 201 with a small JSON) under the Procfile's "
        "web line (its server and settings), driven by the load generator above.",
        "- **L3**: raw RQ no-op jobs on the Procfile's worker command. *Batch*: N jobs enqueued at once, time until "
        "all finished. *Chained*: each job enqueues the next, so jobs run strictly one after another, as unwind "
        "steps do; its per-job time is what unwind steps are compared with.",
        "",
    ]
    return out


def _closing_markdown(results: dict[str, Any]) -> list[str]:
    """Notes, failed phases, the findings (bench/findings.md) and how to reproduce."""
    out: list[str] = []
    if results.get("notes"):
        out += ["", "## Notes", "", *[f"- {n}" for n in results["notes"]]]
    if results.get("errors"):
        out += ["", "## Phases that failed", ""]
        for e in results["errors"]:
            out.append(f"- **{e['phase']}**: `{e['error']}`")
    findings = Path(__file__).with_name("findings.md")
    if findings.exists():
        out += ["", findings.read_text().rstrip()]
    out += [
        "",
        "## Reproduce",
        "",
        "    make bench          # full size; about an hour on 2 cores, half of it seeding the size phase's year",
        "    make bench-size     # the 'At size' phase alone (10M actions; BENCH_ARGS='--size-actions 1000000')",
        "    make bench-smoke    # tiny sizes, to check the harness",
        "",
    ]
    return out
