"""``make bench``'s append phase: the ledger append over HTTP on the Procfile's web line.

Each client is an agent with its own key recording actions for fresh runs, ten per run: record
action, then record → start → succeed, at 1 and 16 clients; then at 16 clients a tool whose policy
has two limits, and the same actions through plans of ``PLAN_SIZE`` (``POST /runs/{id}/plan``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench.sizes import CLIENT_COUNTS
from bench.stats import log, summarize
from bench.tables import machine_limit, measured_row

if TYPE_CHECKING:
    from bench.harness import Harness

# The actions of one plan in the append phase's plan measurement (the targets speak of plans of 5).
PLAN_SIZE = 5


# --- The phase ------------------------------------------------------------------------------


def phase(h: Harness) -> None:
    from bench import fixtures

    s = h.section("append")
    max_clients = max(CLIENT_COUNTS)
    keys = fixtures.agent_keys(tenant_slug="bench", count=max_clients)
    fixtures.load_bench_policies(h.log_dir)
    l2 = h.section("baselines").get(f"L2_{max_clients}", {}).get("throughput", 2000)
    per_run = 10
    # Enough fresh runs that no client runs out at up to half the no-op app's rate (a client
    # that did run out would go on recording into its last run).
    runs_needed = int(l2 * 0.5 * (h.sizes.warmup_s + h.sizes.window_s) / per_run / max_clients) + 2
    web = h.start_web("web-append")
    try:
        for scenario in ("record_action", "action_lifecycle"):
            for n in CLIENT_COUNTS:
                log(f"ledger append over HTTP: {scenario}, {n} client(s)")
                runs = fixtures.fresh_runs(keys=keys[:n], per_client=runs_needed)
                params = {
                    "runs": runs,
                    "per_run": per_run,
                    "headers_per_client": {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)},
                }
                result = h.load(scenario, n, params, web=web)
                entry = {op: summarize(result, op) for op in result.ops()}
                for op_summary in entry.values():
                    op_summary["errors"] = result.error_count()
                s[f"{scenario}_{n}"] = entry
        # The same append where the tool's policy has two limits (a count per agent, a sum
        # per tenant): what limits add to a record.
        n = max_clients
        log(f"ledger append over HTTP: record_action with two limits, {n} clients")
        runs = fixtures.fresh_runs(keys=keys[:n], per_client=runs_needed)
        params = {
            "runs": runs,
            "per_run": per_run,
            "tool": "bench.limited_update",
            "headers_per_client": {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)},
        }
        result = h.load("record_action", n, params, web=web)
        entry = {op: summarize(result, op) for op in result.ops()}
        for op_summary in entry.values():
            op_summary["errors"] = result.error_count()
        s[f"record_action_limited_{n}"] = entry
        # The same actions recorded through plans (POST /runs/{id}/plan): the
        # request's cost paid once per PLAN_SIZE actions. Throughput counts plans; the actions
        # recorded per second are PLAN_SIZE times it, p99 is per request (per plan).
        log(f"ledger append over HTTP: record_plan of {PLAN_SIZE}, {n} clients")
        runs = fixtures.fresh_runs(keys=keys[:n], per_client=runs_needed)
        params = {
            "runs": runs,
            "per_run": per_run,
            "plan_size": PLAN_SIZE,
            "headers_per_client": {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)},
        }
        result = h.load("record_plan", n, params, web=web)
        entry = {op: summarize(result, op) for op in result.ops()}
        for op_summary in entry.values():
            op_summary["errors"] = result.error_count()
            op_summary["plan_size"] = PLAN_SIZE
            op_summary["actions_per_s"] = op_summary["throughput"] * PLAN_SIZE
        s[f"record_plan_{n}"] = entry
    finally:
        web.stop()


# --- The report -----------------------------------------------------------------------------


def rows(append: dict[str, Any], base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for n in (1, 16):
        limit = machine_limit(base, n)
        rec = append.get(f"record_action_{n}", {}).get("record_action")
        rows.append(measured_row(f"append: record action ({n} clients)", rec, limit))
        life = append.get(f"action_lifecycle_{n}", {})
        if life:
            for op in ("sequence", "record_action", "start", "succeed"):
                label = "append: record→start→succeed" if op == "sequence" else f"  lifecycle: {op}"
                rows.append(
                    measured_row(
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
            measured_row(
                f"append: actions through plans of {plan.get('plan_size')}, actions/s; latency per plan "
                "(16 clients)",
                per_action,
                machine_limit(base, 16),
            )
        )
    limited = append.get("record_action_limited_16", {}).get("record_action")
    if limited:
        rows.append(
            measured_row(
                "append: record action, tool with 2 limits (16 clients)", limited, machine_limit(base, 16)
            )
        )
    for key, entry in append.items():
        if key.startswith("candidate_web_concurrency_"):
            workers = key.rsplit("_", 1)[1]
            rows.append(
                measured_row(
                    f"  candidate: WEB_CONCURRENCY={workers}, record action (16 clients)",
                    entry.get("record_action"),
                    machine_limit(base, 16),
                )
            )
    return rows


def targets(sec: dict[str, Any], base: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    out: list[tuple[str, str, bool | None]] = []
    limit = machine_limit(base, 16)
    rec = sec.get("append", {}).get("record_action_16", {}).get("record_action")
    if rec and limit:
        ratio = rec["throughput"] / limit
        out.append(
            (
                "ledger append (16 clients) ≥ 30% of min(L1, L2)",
                f"{rec['throughput']:,.0f}/s = {ratio:.0%} of {limit:,.0f}/s",
                ratio >= 0.30,
            )
        )
        out.append(("ledger append p99 ≤ 50 ms", f"p99 {rec['p99_ms']:.1f} ms", rec["p99_ms"] <= 50))
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
                f"actions through plans of {plan['plan_size']} (16 clients) ≥ 25% of min(L1, L2)",
                f"{plan['actions_per_s']:,.0f} actions/s = {ratio:.0%} of {limit:,.0f}/s",
                ratio >= 0.25,
            )
        )
        out.append(
            (
                "a plan's p99 per request ≤ 150 ms, zero errors",
                f"p99 {plan['p99_ms']:.1f} ms, {plan['errors']} errors",
                plan["p99_ms"] <= 150 and plan["errors"] == 0,
            )
        )
    else:
        out.append(
            (
                "actions through plans of 5 (16 clients) ≥ 25% of min(L1, L2), p99 ≤ 150 ms",
                "not measured",
                None,
            )
        )
    return out


def markdown(sec: dict[str, Any]) -> list[str]:
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
