"""One table for the terminal, one Markdown page for docs/BENCHMARKS.md, from the same results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import audit_stream, reads, size, soak_report, tracing
from bench.dashboard import BENCH_INDEXES

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
    "Servers",
    "Workers scale-out",
    "Bulk decisions",
    "At size",
    "Soak",
    "Targets",
)
# The hot-path figures of one server configuration (bench.run's ``hot_path``), in order.
HOT_PATH = {
    "append": "append: record action",
    "floor": "framework floor: GET a run's checkpoints",
    "heartbeat": "heartbeat",
}
# A record's cost by the size of its args (bench.run's ``record_size`` phase).
RECORD_SIZES = {
    "small": "record action, small args",
    "megabyte": "record action, args just under 1 MiB (~94,000 small objects)",
    "small_gated": "record action that waits for a person, small args",
    "megabyte_gated": "record action that waits for a person, args just under 1 MiB",
}
# The pairs the 10× target compares: (small, near-limit, what the tool's policy asks).
RECORD_SIZE_PAIRS = (
    ("small", "megabyte", "needs no approval"),
    ("small_gated", "megabyte_gated", "waits for a person"),
)
# The refusal figures (bench.run's ``unauthenticated`` phase), in the order they are shown.
REFUSALS = {
    "tiny_no_key": "POST without a key, tiny body",
    "megabyte_no_key": "POST without a key, 1 MiB body",
    "tiny_unknown_key": "POST with an unknown key, tiny body",
    "megabyte_unknown_key": "POST with an unknown key, 1 MiB body",
    "megabyte_valid_key": "POST with a valid key, 1 MiB body (read and parsed; 422)",
}


def _load_row(label: str, entry: dict[str, Any], note: str) -> list[str]:
    """One row of a load table: the measured columns of ``entry``, then ``note``."""
    return [
        label,
        _f(entry.get("clients")),
        _f(entry.get("throughput")),
        _f(entry.get("p50_ms"), 2),
        _f(entry.get("p95_ms"), 2),
        _f(entry.get("p99_ms"), 2),
        _f(entry.get("errors")),
        _f(entry.get("server_cpu_ms_per_request"), 2),
        note,
    ]


def _f(value: Any, digits: int = 1) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _measured_row(label: str, entry: dict[str, Any] | None, limit: float | None = None) -> list[str]:
    """A load table's row for ``entry`` with its throughput's ratio to ``limit``, or a row saying
    it was not measured."""
    if not entry:
        return [label, "–", "not measured", "–", "–", "–", "–", "–", "–"]
    ratio = _ratio(entry.get("throughput"), limit)
    return _load_row(label, entry, f"{ratio:.0%}" if ratio is not None else "–")


def _rows(results: dict[str, Any]) -> list[list[str]]:
    """The one table: every figure with its ratio to the machine's limit."""
    sec = results.get("sections", {})
    base = sec.get("baselines", {})
    rows = [
        *_baseline_rows(base),
        *_append_rows(sec.get("append", {}), base),
        *tracing.rows(sec.get("traces", {}), _load_row),
        *_record_size_rows(sec.get("record_size", {})),
        *audit_stream.rows(sec.get("audit_stream", {}), base),
        *_refusal_rows(sec.get("unauthenticated", {})),
        *_dashboard_rows(sec.get("dashboard", {})),
        *reads.rows(sec.get("reads", {}), _load_row),
        *_unwind_rows(sec.get("unwind", {}), base),
        *_hot_path_rows(sec.get("servers", {}), base),
        *_workers_rows(sec.get("workers", {})),
        *_bulk_rows(sec.get("bulk", {})),
        *soak_report.rows(sec.get("soak", {})),
    ]
    # Rows without a server-CPU figure get a dash in that column.
    return [r if len(r) == len(HEADER) else [*r[:7], "–", *r[7:]] for r in rows]


def _baseline_rows(base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for n in (1, 16):
        rows.append(_measured_row(f"L1 raw INSERT ({n} conn)", base.get(f"L1_{n}")))
        rows.append(_measured_row(f"L2 no-op WSGI ({n} clients)", base.get(f"L2_{n}")))
    for kind in ("L3_batch", "L3_chain", "L3_batch_candidate", "L3_chain_candidate"):
        entry = base.get(kind)
        if entry:
            how = "batch" if kind.startswith("L3_batch") else "chained"
            who = "candidate SimpleWorker" if kind.endswith("_candidate") else "Procfile worker"
            rows.append(
                [
                    f"L3 RQ no-op, {how} ({entry['jobs']} jobs, {who})",
                    "1 worker",
                    _f(entry["jobs_per_s"]),
                    _f(entry["per_job_ms"], 2) + " /job",
                    "–",
                    "–",
                    "0",
                    "–",
                ]
            )
    return rows


def _append_rows(append: dict[str, Any], base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for n in (1, 16):
        limit = _limit(base, n)
        rec = append.get(f"record_action_{n}", {}).get("record_action")
        rows.append(_measured_row(f"append: record action ({n} clients)", rec, limit))
        life = append.get(f"action_lifecycle_{n}", {})
        if life:
            for op in ("sequence", "record_action", "start", "succeed"):
                label = "append: record→start→succeed" if op == "sequence" else f"  lifecycle: {op}"
                rows.append(
                    _measured_row(
                        f"{label} ({n} clients)",
                        life.get(op),
                        limit * 1 / 3 if op == "sequence" and limit else limit,
                    )
                )
    plan = append.get("record_plan_16", {}).get("record_plan")
    if plan:
        # The row counts actions (plan_size per request); p50/p95/p99 are per request (per plan).
        per_action = {**plan, "throughput": plan.get("actions_per_s")}
        rows.append(
            _measured_row(
                f"append: actions through plans of {plan.get('plan_size')}, actions/s; latency per plan "
                "(16 clients)",
                per_action,
                _limit(base, 16),
            )
        )
    limited = append.get("record_action_limited_16", {}).get("record_action")
    if limited:
        rows.append(
            _measured_row("append: record action, tool with 2 limits (16 clients)", limited, _limit(base, 16))
        )
    for key, entry in append.items():
        if key.startswith("candidate_web_concurrency_"):
            workers = key.rsplit("_", 1)[1]
            rows.append(
                _measured_row(
                    f"  candidate: WEB_CONCURRENCY={workers}, record action (16 clients)",
                    entry.get("record_action"),
                    _limit(base, 16),
                )
            )
    return rows


def _record_size_rows(sizes: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for key, label in RECORD_SIZES.items():
        entry = sizes.get(key)
        if entry:
            cpu_ratio = _ratio(
                entry.get("server_cpu_ms_per_request"),
                sizes.get("small_gated" if key.endswith("_gated") else "small", {}).get(
                    "server_cpu_ms_per_request"
                ),
            )
            rows.append(
                _load_row(
                    f"record size: {label}",
                    entry,
                    f"server CPU {cpu_ratio:.1f}x the small one" if cpu_ratio is not None else "–",
                )
            )
    return rows


def _refusal_rows(refusals: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for key, label in REFUSALS.items():
        entry = refusals.get(key)
        if entry:
            # Compared with the tiny body sent the same way (no key, or the same unknown key).
            twin = "tiny_unknown_key" if key == "megabyte_unknown_key" else "tiny_no_key"
            ratio = _ratio(entry.get("p50_ms"), refusals.get(twin, {}).get("p50_ms"))
            rows.append(
                _load_row(
                    f"refusal: {label}", entry, f"p50 {ratio:.1f}x the tiny one" if ratio is not None else "–"
                )
            )
    return rows


def _dashboard_rows(dash: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, t in dash.get("timings", {}).items():
        q_small = dash.get("queries_small", {}).get(name, {}).get("queries")
        q_full = dash.get("queries_full", {}).get(name, {}).get("queries")
        rows.append(
            [
                f"page: {name}",
                "1",
                "–",
                _f(t.get("p50_ms"), 1),
                _f(t.get("p95_ms"), 1),
                "–",
                _f(t.get("errors")),
                f"{_f(q_full)} queries (small data: {_f(q_small)})",
            ]
        )
    return rows


def _unwind_rows(unwind: dict[str, Any], base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    sources = [(unwind, "L3_chain", "Procfile worker")]
    for name, measured in unwind.get("candidates", {}).items():
        # Compared with the L3 no-op job of the same worker class (the candidate worker's).
        sources.append((measured, "L3_chain_candidate", f"candidate {name}"))
    for source, chain_key, who in sources:
        chain = base.get(chain_key, {}).get("per_job_ms")
        for key, label in (
            ("single", "unwind: 1 x {n} steps"),
            ("concurrent", "unwind: {c} concurrent x {n} steps"),
        ):
            u = source.get(key)
            if u:
                ratio = _ratio(u["per_step_ms"], chain)
                rows.append(
                    [
                        label.format(n=source.get("steps_per_unwind"), c=u["unwinds"]) + f" ({who})",
                        "1 worker",
                        _f(u["steps_per_s"]) + " steps",
                        _f(u["per_step_ms"], 2) + " /step",
                        _f(u["seconds"], 2) + " s total",
                        "–",
                        "–",
                        f"{ratio:.2f}x L3 chained job" if ratio else "–",
                    ]
                )
    return rows


def _hot_path_rows(servers: dict[str, Any], base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    procfile = servers.get("configs", {}).get("Procfile")
    if procfile:
        limit = _limit(base, 16)
        for key, label in HOT_PATH.items():
            rows.append(
                _measured_row(f"hot path, Procfile's server: {label} (16 clients)", procfile.get(key), limit)
            )
        step = procfile.get("full_step", {})
        rows.append(
            _measured_row(
                "hot path, Procfile's server: full step, record(start) → succeed (16 clients)",
                step.get("step"),
                limit / 2 if limit else None,
            )
        )
    return rows


def _workers_rows(workers: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for n, trial in workers.get("trials", {}).items():
        rows.append(
            [
                f"workers: {trial['steps']} webhook steps of {workers.get('delay_ms', 0):.0f} ms",
                f"{n} worker(s)",
                _f(trial["steps_per_s"]) + " steps",
                _f(trial["per_step_ms"], 2) + " /step",
                _f(trial["seconds"], 2) + " s total",
                "–",
                _f(trial["step_statuses"].get("failed", 0) + trial["receiver_refused"]),
                f"≤ {trial['receiver_max_concurrent']} calls at once",
            ]
        )
    return rows


def _bulk_rows(bulk: dict[str, Any]) -> list[list[str]]:
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
                _f(preview["p50_ms"], 2),
                _f(preview["p95_ms"], 2),
                "–",
                _f(sum(preview["errors"].values())),
                f"{preview['samples']} samples, max {preview['max_ms']:,.0f} ms",
            ]
        )
    run = bulk.get("bulk")
    if run:
        rows.append(
            [
                f"bulk: close {run['total']:,} items ({bulk.get('clients', 16)} clients appending)",
                "1 worker",
                _f(run["items_per_s"]) + " items",
                _f(run["ms_per_item"], 2) + " /item",
                (_f(run["seconds"], 1) + " s total") if run["seconds"] is not None else "not finished",
                "–",
                _f(run["failed"]),
                f"{run['status']}: {run['done']:,} done, {run['failed']:,} failed, {run['skipped']:,} skipped",
            ]
        )
    before, during = bulk.get("append_before"), bulk.get("append_during")
    if before:
        rows.append(
            _load_row(
                f"bulk: append, record action ({before['clients']} clients), no bulk", before, "baseline"
            )
        )
    if during:
        note = "–"
        if before and before.get("p99_ms"):
            note = f"p99 {during['p99_ms'] / before['p99_ms']:.2f}x the baseline's"
        rows.append(
            _load_row(
                f"bulk: append, record action ({during['clients']} clients), during the bulk", during, note
            )
        )
    return rows


def _limit(base: dict[str, Any], n: int) -> float | None:
    values = [base.get(f"L1_{n}", {}).get("throughput"), base.get(f"L2_{n}", {}).get("throughput")]
    values = [v for v in values if v]
    return min(values) if values else None


HEADER = [
    "figure",
    "clients",
    "throughput /s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "errors",
    "server CPU ms/req",
    "ratio / note",
]


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met?) — None when the figure could not be measured."""
    sec = results.get("sections", {})
    base = sec.get("baselines", {})
    return [
        *_append_targets(sec, base),
        *tracing.targets(sec.get("traces", {}), sec.get("append", {})),
        *_record_size_targets(sec),
        *_refusal_targets(sec),
        *_dashboard_targets(sec),
        *reads.targets(sec.get("reads", {})),
        *_unwind_targets(sec, base),
        *_hot_path_targets(results),
        *_bulk_targets(sec.get("bulk", {})),
        *size.targets(sec.get("size", {})),
        *soak_report.targets(sec.get("soak", {})),
    ]


# Issue 31's targets for bulk decisions by filter (full size: 10,000 items).
BULK_PREVIEW_MS = 1000
BULK_SECONDS = 120
BULK_APPEND_P99_MS = 150


def _bulk_targets(bulk: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    items = bulk.get("items") or 10_000
    names = (
        f"bulk preview of a filter matching {items:,} items < {BULK_PREVIEW_MS / 1000:.0f} s (issue 31)",
        f"bulk decides {items:,} close decisions in < {BULK_SECONDS // 60} minutes, every one decided (issue 31)",
        f"append p99 ≤ {BULK_APPEND_P99_MS} ms (16 clients) while the bulk runs (issue 31)",
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


def _append_targets(sec: dict[str, Any], base: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    limit = _limit(base, 16)
    rec = sec.get("append", {}).get("record_action_16", {}).get("record_action")
    if rec and limit:
        ratio = rec["throughput"] / limit
        out.append(
            (
                "ledger append (16 clients) ≥ 30% of min(L1, L2) (issue 8)",
                f"{rec['throughput']:,.0f}/s = {ratio:.0%} of {limit:,.0f}/s",
                ratio >= 0.30,
            )
        )
        out.append(
            ("ledger append p99 ≤ 50 ms (issue 8)", f"p99 {rec['p99_ms']:.1f} ms", rec["p99_ms"] <= 50)
        )
        out.append(
            (
                "ledger append: zero errors",
                f"{rec['errors']} errors {rec.get('error_detail') or ''}".strip(),
                rec["errors"] == 0,
            )
        )
    else:
        out.append(
            (
                "ledger append (16 clients) ≥ 30% of min(L1, L2), p99 ≤ 50 ms, zero errors",
                "not measured",
                None,
            )
        )
    plan = sec.get("append", {}).get("record_plan_16", {}).get("record_plan")
    if plan and limit:
        ratio = plan["actions_per_s"] / limit
        out.append(
            (
                f"actions through plans of {plan['plan_size']} (16 clients) ≥ 25% of min(L1, L2) (issue 30)",
                f"{plan['actions_per_s']:,.0f} actions/s = {ratio:.0%} of {limit:,.0f}/s",
                ratio >= 0.25,
            )
        )
        out.append(
            (
                "a plan's p99 per request ≤ 150 ms, zero errors (issue 30)",
                f"p99 {plan['p99_ms']:.1f} ms, {plan['errors']} errors",
                plan["p99_ms"] <= 150 and plan["errors"] == 0,
            )
        )
    else:
        out.append(
            (
                "actions through plans of 5 (16 clients) ≥ 25% of min(L1, L2), p99 ≤ 150 ms (issue 30)",
                "not measured",
                None,
            )
        )
    return out


def _record_size_targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    return _record_size_checks(sec.get("record_size"))


def _refusal_targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    refusals = sec.get("unauthenticated", {})
    pairs = [("without a key", "tiny_no_key", "megabyte_no_key")]
    if "tiny_unknown_key" in refusals:
        pairs.append(("with an unknown key", "tiny_unknown_key", "megabyte_unknown_key"))
    for how, tiny_key, big_key in pairs:
        tiny, big = refusals.get(tiny_key), refusals.get(big_key)
        if not (tiny and big and tiny["p50_ms"] and tiny.get("server_cpu_ms_per_request")):
            out.append((f"a 1 MiB POST {how} costs ≤ 3× a tiny one", "not measured", None))
            continue
        latency = big["p50_ms"] / tiny["p50_ms"]
        cpu = (big.get("server_cpu_ms_per_request") or 0) / tiny["server_cpu_ms_per_request"]
        out.append(
            (
                f"a 1 MiB POST {how} costs ≤ 3× a tiny one (p50 latency)",
                f"p50 {big['p50_ms']:.2f} ms vs {tiny['p50_ms']:.2f} ms = {latency:.1f}x",
                latency <= 3,
            )
        )
        out.append(
            (
                f"a 1 MiB POST {how} costs ≤ 3× a tiny one (server CPU per request)",
                f"{big['server_cpu_ms_per_request']:.2f} ms vs {tiny['server_cpu_ms_per_request']:.2f} ms "
                f"= {cpu:.1f}x",
                cpu <= 3,
            )
        )
    unanswered = {k: v["errors"] for k, v in refusals.items() if k != "megabyte_valid_key" and v["errors"]}
    if refusals:
        out.append(
            (
                "requests without a valid key: every one answered 401",
                f"{sum(unanswered.values())} errors {unanswered or ''}".strip(),
                not unanswered,
            )
        )
    return out


def _dashboard_targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
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


def _unwind_targets(sec: dict[str, Any], base: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    unwind = sec.get("unwind", {})
    chain = base.get("L3_chain", {}).get("per_job_ms")
    single = unwind.get("single")
    if single and chain:
        out.append(
            (
                "unwind step overhead ≤ 2× an L3 no-op job (chained, same worker)",
                f"{single['per_step_ms']:.1f} ms/step vs {chain:.1f} ms/job = {single['per_step_ms'] / chain:.2f}x",
                single["per_step_ms"] <= 2 * chain,
            )
        )
        n = unwind.get("steps_per_unwind")
        out.append(
            (
                f"a {n}-step no-op unwind completes in < 2 s",
                f"{single['seconds']:.2f} s",
                single["seconds"] < 2.0 and single["unwind_statuses"] == ["completed"],
            )
        )
    else:
        out.append(("unwind step overhead ≤ 2× L3; 50-step unwind < 2 s", "not measured", None))
    return out


def _hot_path_targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issue 19's restated targets, from the Procfile's server in the servers section (append,
    floor, heartbeat and full step measured one after another on the same running server) and
    the baselines of the same run; and the workers' scale-out."""
    sec = results.get("sections", {})
    out: list[tuple[str, str, bool | None]] = []
    hot = sec.get("servers", {}).get("configs", {}).get("Procfile")
    limit = _limit(sec.get("baselines", {}), 16)
    if not hot:
        out.append(("hot path on the Procfile's server (issue 19 targets)", "not measured", None))
    else:
        append, floor, heartbeat = hot["append"], hot["floor"], hot["heartbeat"]
        if limit:
            ratio = append["throughput"] / limit
            out.append(
                (
                    "append (16 clients) ≥ 0.10 of min(L1, L2) (issue 19)",
                    f"{append['throughput']:,.0f}/s = {ratio:.2f} of {limit:,.0f}/s",
                    ratio >= 0.10,
                )
            )
        else:
            out.append(
                ("append (16 clients) ≥ 0.10 of min(L1, L2) (issue 19)", "baselines not measured", None)
            )
        floor_ratio = _ratio(append["throughput"], floor["throughput"]) or 0.0
        out.append(
            (
                "append ≥ 0.60 of the framework floor (GET a run's checkpoints, same server, 16 clients)",
                f"{append['throughput']:,.0f}/s vs {floor['throughput']:,.0f}/s = {floor_ratio:.2f}",
                floor_ratio >= 0.60,
            )
        )
        out.append(
            ("append p99 ≤ 150 ms (issue 19)", f"p99 {append['p99_ms']:.1f} ms", append["p99_ms"] <= 150)
        )
        out.append(
            (
                "append: zero errors (issue 19)",
                f"{append['errors']} errors {append.get('error_detail') or ''}".strip(),
                append["errors"] == 0,
            )
        )
        hb_ratio = _ratio(heartbeat["throughput"], floor["throughput"]) or 0.0
        out.append(
            (
                "heartbeat ≥ 0.80 of the framework floor",
                f"{heartbeat['throughput']:,.0f}/s vs {floor['throughput']:,.0f}/s = {hb_ratio:.2f}",
                hb_ratio >= 0.80 and heartbeat["errors"] == 0,
            )
        )
        step = hot.get("full_step", {}).get("step")
        if step:
            out.append(
                (
                    "full step (record with start: true → succeed) reported per tool call",
                    f"{step['throughput']:,.0f} tool calls/s (2 requests each), p50 {step['p50_ms']:.1f} ms, "
                    f"p99 {step['p99_ms']:.1f} ms per tool call, {step['errors']} errors",
                    step["errors"] == 0,
                )
            )
    workers = sec.get("workers", {})
    trials = workers.get("trials", {})
    if workers.get("speedup") and trials:
        counts = sorted(trials, key=int)
        one, many = trials[counts[0]], trials[counts[-1]]
        clean = all(t["unwind_statuses"] == ["completed"] for t in trials.values())
        out.append(
            (
                f"{counts[-1]} worker processes finish {many['steps']} I/O-bound steps ≥ 3× faster than {counts[0]}",
                f"{one['seconds']:.1f} s vs {many['seconds']:.1f} s = {workers['speedup']:.2f}x",
                workers["speedup"] >= 3 and clean,
            )
        )
    else:
        out.append(("4 worker processes finish 200 I/O-bound steps ≥ 3× faster than 1", "not measured", None))
    return out


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, "-" * len(line), *body])


def _md_table(rows: list[list[str]], header: list[str]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return "\n".join(
        [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in esc],
        ]
    )


def _mark(met: bool | None) -> str:
    return "met" if met else ("not measured" if met is None else "MISSED")


def render(results: dict[str, Any], *, smoke: bool) -> tuple[str, str]:
    rows = _rows(results)
    goals = targets(results)
    text = (
        _table(rows, HEADER)
        + "\n\nTargets:\n"
        + "\n".join(f"  [{_mark(met)}] {name}: {value}" for name, value, met in goals)
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
            *_baselines_markdown(base),
            *_append_markdown(sec),
            *tracing.markdown(sec.get("traces", {})),
            *_refusals_markdown(sec),
            *_record_size_markdown(sec),
            *_dashboard_markdown(sec),
            *reads.markdown(sec.get("reads", {})),
            *_unwind_markdown(sec, base),
            *_servers_markdown(sec.get("servers", {}), base),
            *_workers_markdown(sec.get("workers", {})),
            *_bulk_markdown(sec.get("bulk", {})),
            *size.markdown(sec.get("size", {})),
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
        f"- web: the Procfile's line when measured, `{_procfile('web', results)}`; worker: "
        f"`{_procfile('worker', results)}`",
        "",
        "Load generator (L2 and every HTTP figure): 4 client processes (spawned), one thread and one keep-alive "
        "`http.client` connection per client, reconnecting when the server closes; a warm-up is discarded, "
        "then requests that start inside the measurement window count. It runs on the same 2 cores as the "
        "server and PostgreSQL; its own CPU time is reported.",
        "",
        "## Results",
        "",
        _md_table(rows, HEADER),
        "",
        "## Targets",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *[f"| {n} | {v.replace('|', '/')} | {_mark(met)} |" for n, v, met in goals],
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


def _baselines_markdown(base: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("L1_1", "L1_16", "L2_1", "L2_16"):
        e = base.get(key)
        if e:
            out.append(
                f"- {key}: {e['count']:,} requests in {e['window_s']:.0f} s, client CPU {e['client_cpu_s']:.1f} s, "
                f"errors {e['errors']} {e.get('error_detail') or ''}"
            )
    return out


def _append_markdown(sec: dict[str, Any]) -> list[str]:
    out = [
        "",
        "## Ledger append",
        "",
        "The Procfile's web line (see Machine) serving the product's own settings (DEBUG off). Each client is an agent "
        "with its own API key recording actions (`POST /api/v1/runs/{id}/actions`) for fresh runs, ten "
        "actions per run; the sequence figure is record → start → succeed for one action, timed end to end. "
        "Ratios are to min(L1, L2) at the same client count (a sequence is three requests, so its ratio is to "
        "a third of it).",
        "",
    ]
    for key, entry in sec.get("append", {}).items():
        for op, e in entry.items():
            out.append(
                f"- {key} / {op}: {e['count']:,} in {e['window_s']:.0f} s, {e['throughput']:,.1f}/s, p50 "
                f"{e['p50_ms']:.1f} ms, p95 {e['p95_ms']:.1f} ms, p99 {e['p99_ms']:.1f} ms, client CPU "
                f"{e['client_cpu_s']:.1f} s, errors {e['errors']} {e.get('error_detail') or ''}"
            )
    return out


def _refusals_markdown(sec: dict[str, Any]) -> list[str]:
    out = [
        "",
        "## Unauthenticated requests",
        "",
        "The Procfile's web line serving the product's settings; one client POSTs to `/api/v1/runs` over a "
        "fresh connection per request, sending the body while watching for an early answer (as curl does), "
        "and stops sending once the whole response is in. The 1 MiB body is ~95,000 small objects, the "
        "costliest megabyte to parse and check. Without a valid key the API answers 401 from the headers, "
        "before reading the body (gunicorn's sync worker then discards at most 64 KiB of it while closing "
        "the connection; its gthread worker keeps the connection and reads and drops the rest, unparsed, "
        "before the next request); the same "
        "megabyte with a valid key is read, parsed and checked, then refused (422): the work every "
        "unauthenticated megabyte caused before the key was checked first (the findings below give the "
        "figure measured on that code). The per-address limit on "
        "refusals is set out of reach here, as the per-key one is.",
        "",
    ]
    for key, label in REFUSALS.items():
        e = sec.get("unauthenticated", {}).get(key)
        if e:
            out.append(
                f"- {label}: {e['count']:,} in {e['window_s']:.0f} s, p50 {e['p50_ms']:.2f} ms, p95 "
                f"{e['p95_ms']:.2f} ms, server CPU {_f(e.get('server_cpu_ms_per_request'), 2)} ms/request, "
                f"client CPU {e['client_cpu_s']:.1f} s, errors {e['errors']} {e.get('error_detail') or ''}"
            )
    return out


def _record_size_markdown(sec: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if sec.get("record_size"):
        out += [
            "",
            "## Record size",
            "",
            "The Procfile's web line serving the product's settings; one client records actions "
            "(`POST /api/v1/runs/{id}/actions`) over a keep-alive connection: "
            "small args, then args that bring the body just under 1 MiB as ~94,000 small objects (the "
            "costliest megabyte to parse, hash, store and echo back); first for a tool that needs no "
            "approval, then for one that waits for a person (no policy names it, so the default "
            "policy's approval is opened for it: the path an attacker with a key picks). Server CPU is the web processes' "
            "own; PostgreSQL's share is not in it (the findings below give it, measured apart). "
            "The per-key byte budget is set out of reach here, as the request rate is.",
            "",
        ]
        for key, label in RECORD_SIZES.items():
            e = sec["record_size"].get(key)
            if e:
                out.append(
                    f"- {label}: {e['count']:,} in {e['window_s']:.0f} s, p50 {e['p50_ms']:.2f} ms, p95 "
                    f"{e['p95_ms']:.2f} ms, server CPU {_f(e.get('server_cpu_ms_per_request'), 2)} ms/request, "
                    f"client CPU {e['client_cpu_s']:.1f} s, errors {e['errors']} {e.get('error_detail') or ''}"
                )
    return out


def _dashboard_markdown(sec: dict[str, Any]) -> list[str]:
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
                    f"*Before* the benchmark-motivated indexes ({', '.join(f'`{i}`' for i in BENCH_INDEXES)}; same data, dropped in a rolled-back "
                    f"transaction): {b['total_execution_ms']:.1f} ms; sequential scans over big tables: "
                    f"{', '.join(b['seq_scans_big']) or 'none'}"
                )
            out.append("")
            for q in e["main"]:
                out.append(f"- {q['execution_ms']:.2f} ms: {', '.join(q['scans']) or 'no table scan'}")
                out.append(f"  `{_short_sql(q['sql'])}`")
            out.append("")
    return out


def _unwind_markdown(sec: dict[str, Any], base: dict[str, Any]) -> list[str]:
    unwind = sec.get("unwind", {})
    out = [
        "## Unwind",
        "",
        "Runs whose actions each registered the `bench.undo` compensation (a Python no-op compensator), failed "
        "into the recovery queue and compensated with the product's own services; one Procfile worker carries "
        "the steps out. Time from the Compensate decision to the unwind's `finished_at`.",
        "",
    ]
    for key in ("single", "concurrent"):
        u = unwind.get(key)
        if u:
            out.append(
                f"- {key}: {u['unwinds']} unwind(s), {u['steps']} steps in {u['seconds']:.2f} s = "
                f"{u['per_step_ms']:.1f} ms/step ({u['steps_per_s']:.1f} steps/s); unwinds "
                f"{u['unwind_statuses']}, steps {u['step_statuses']}"
            )
    chain = base.get("L3_chain")
    if chain:
        out.append(f"- L3 chained no-op job on the same worker: {chain['per_job_ms']:.1f} ms/job")
    for name, cand in unwind.get("candidates", {}).items():
        for key in ("single", "concurrent"):
            u = cand.get(key)
            if u:
                out.append(
                    f"- candidate `{name}` (`bench/candidate_worker.py`), {key}: {u['unwinds']} unwind(s), "
                    f"{u['steps']} steps in {u['seconds']:.2f} s = {u['per_step_ms']:.1f} ms/step; "
                    f"unwinds {u['unwind_statuses']}"
                )
    chain = base.get("L3_chain_candidate")
    if chain:
        out.append(f"- L3 chained no-op job on the candidate worker: {chain['per_job_ms']:.1f} ms/job")
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


def _servers_markdown(servers: dict[str, Any], base: dict[str, Any]) -> list[str]:
    out = [
        "",
        "## Servers",
        "",
        "The hot path of an agent on each web server configuration, one after another, 16 clients (one key "
        "each, keep-alive) against the product's settings: *append* records an action "
        "(`POST /api/v1/runs/{id}/actions`, fresh runs, ten actions each); the *floor* is the project's "
        "cheapest authenticated request, `GET /api/v1/runs/{id}/checkpoints` (the key, the run's ownership, "
        "one small page); *heartbeat* is `POST /api/v1/runs/{id}/heartbeat`; the *full step* is one tool call "
        "as the client records it, a record with `start: true` then `…/succeed`, counted per tool call "
        "(two requests). The *Procfile* row is the web line as committed when the run started (it names the "
        "candidate it equals); the others are candidates. Server CPU is the web processes' own, per append.",
        "",
    ]
    configs = servers.get("configs", {})
    if not configs:
        return [*out, "Not measured in this run.", ""]
    limit = _limit(base, 16)
    out += [
        "| configuration | append /s | append p50 / p99 ms | floor /s | heartbeat /s | full step: tool calls /s "
        "| step p50 / p99 ms | append ÷ floor | heartbeat ÷ floor | append ÷ min(L1, L2) | server CPU ms/append "
        "| errors |",
        "|" + "---|" * 12,
    ]
    for name, c in configs.items():
        label = name
        if name == "Procfile" and servers.get("procfile_is"):
            label = f"Procfile (= {servers['procfile_is']})"
        append, floor, heartbeat = c["append"], c["floor"], c["heartbeat"]
        step = c.get("full_step", {}).get("step", {})
        errors = sum(
            e.get("errors", 0)
            for e in (append, floor, heartbeat, *c.get("full_step", {}).values())
            if isinstance(e, dict)
        )
        cells = [
            label,
            _f(append["throughput"]),
            f"{append['p50_ms']:.1f} / {append['p99_ms']:.1f}",
            _f(floor["throughput"]),
            _f(heartbeat["throughput"]),
            _f(step.get("throughput")),
            f"{step.get('p50_ms', 0):.1f} / {step.get('p99_ms', 0):.1f}",
            f"{_ratio(append['throughput'], floor['throughput']) or 0:.2f}",
            f"{_ratio(heartbeat['throughput'], floor['throughput']) or 0:.2f}",
            f"{_ratio(append['throughput'], limit) or 0:.3f}",
            _f(append.get("server_cpu_ms_per_request"), 2),
            _f(errors),
        ]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Command lines (the Procfile's with its defaults; `PORT` from the environment):", ""]
    for name, c in configs.items():
        out.append(f"- {name}: `{c['command']}`")
    out.append("")
    return out


def _workers_markdown(workers: dict[str, Any]) -> list[str]:
    out = [
        "## Workers scale-out",
        "",
        "I/O-bound compensations: every step's compensator is a webhook (loaded from the policy file, as an "
        "operator configures one) whose receiver, a threaded HTTP server in the benchmark process, checks the "
        f"signature and takes {workers.get('delay_ms', 200):.0f} ms to answer. Each trial fails its own runs, "
        "one step each (independent steps), starts all their unwinds in one transaction (the jobs reach Redis "
        "together when it commits, and the clock starts there) and stops at the last unwind's `finished_at`, "
        "with 1, 2, then 4 processes of the Procfile's worker line, each warmed by a few uncounted steps.",
        "",
    ]
    trials = workers.get("trials", {})
    if not trials:
        return [*out, "Not measured in this run.", ""]
    out += [
        "| worker processes | steps | seconds | steps /s | ms per step | receiver calls at once (max) | "
        "unwinds | steps by status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, t in sorted(trials.items(), key=lambda kv: int(kv[0])):
        out.append(
            f"| {n} | {t['steps']} | {t['seconds']:.2f} | {t['steps_per_s']:.1f} | {t['per_step_ms']:.1f} | "
            f"{t['receiver_max_concurrent']} | {', '.join(t['unwind_statuses'])} | {t['step_statuses']} |"
        )
    if workers.get("speedup"):
        out += ["", f"Speed-up: **{workers['speedup']:.2f}x** (target ≥ 3.5x, issue 39)."]
    noop = workers.get("noop", {}).get("trials", {}).get("1")
    if noop:
        out += [
            "",
            f"The same steps against a receiver that answers at once, one worker process: {noop['steps']} "
            f"no-op webhook steps in {noop['seconds']:.2f} s = **{noop['steps_per_s']:.1f} steps/s** "
            f"({noop['per_step_ms']:.1f} ms a step; issue 39: at least half of RQ's in-process no-op job "
            "rate, the Unwind section's L3 on the `simple` candidate).",
        ]
    out.append("")
    return out


def _bulk_markdown(bulk: dict[str, Any]) -> list[str]:
    out = [
        "## Bulk decisions",
        "",
        "Bulk decisions by filter at scale (`bench/bulk.py`, issue 31): N failed runs, each with an open "
        "recovery item of one reason, in one tenant (`seed_bench --tenant --reason`, COPY); the Procfile's web "
        "line and one Procfile worker. Over HTTP with an operator key: `POST /api/v1/recovery/bulk` with "
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


def _short_sql(sql: str) -> str:
    return " ".join(sql.split())[:300].replace("`", "'")


def _procfile(name: str, results: dict[str, Any] | None = None) -> str:
    """The Procfile's line as the run measured it (kept in its results), else as it is now."""
    from bench.procs import procfile_lines

    measured = (results or {}).get("procfile") or procfile_lines()
    return str(measured.get(name, "?"))


def _record_size_checks(sizes: dict[str, Any] | None) -> list[tuple[str, str, bool | None]]:
    """The 10× target (issue 26, point 8) per pair of ``RECORD_SIZE_PAIRS``: server CPU and p50."""
    if sizes is None:
        return []
    out: list[tuple[str, str, bool | None]] = []
    for small_key, big_key, gate in RECORD_SIZE_PAIRS:
        small, big = sizes.get(small_key), sizes.get(big_key)
        what = f"a record with 1 MiB of args (a tool that {gate}) costs ≤ 10× a small one"
        if not (small and big and small.get("server_cpu_ms_per_request") and small["p50_ms"]):
            out.append((what, "not measured", None))
            continue
        cpu = (big.get("server_cpu_ms_per_request") or 0) / small["server_cpu_ms_per_request"]
        out.append(
            (
                f"{what} (server CPU per request)",
                f"{big['server_cpu_ms_per_request']:.2f} ms vs {small['server_cpu_ms_per_request']:.2f} ms "
                f"= {cpu:.1f}x",
                cpu <= 10,
            )
        )
        latency = big["p50_ms"] / small["p50_ms"]
        out.append(
            (
                f"{what} (p50 latency)",
                f"p50 {big['p50_ms']:.2f} ms vs {small['p50_ms']:.2f} ms = {latency:.1f}x",
                latency <= 10,
            )
        )
    return out
