"""``make bench``'s servers phase: the hot path of an agent (append, the framework floor, heartbeat,
the full step; 16 clients) on the Procfile's web line and on each candidate server configuration
(gunicorn sync/gthread, granian), one after another; the restated targets come from the
Procfile's line."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench import fixtures, procs
from bench.sizes import CLIENT_COUNTS
from bench.stats import log, summarize
from bench.tables import fmt, machine_limit, measured_row, ratio_of

if TYPE_CHECKING:
    from bench.harness import Harness

# Web server configurations compared on the hot path: whole web lines as the Procfile
# would carry them, each a sensible choice for this 2-core machine. A line equal to the Procfile's
# (after bash's expansion, in the same environment) is measured once, as the Procfile's.
# Neither keeps X-Forwarded-For as the client address: REMOTE_ADDR stays the peer, and the API
# believes forwarded addresses only as far as SAGA_TRUSTED_PROXY_HOPS says. The scheme is the
# server's own (gunicorn's from X-Forwarded-Proto of the peers it trusts; Django reads no forwarded
# header): the bench runs plain HTTP with SECURE_SSL_REDIRECT=0, so no candidate is favoured.


def _gunicorn(options: str) -> str:
    return (
        f"gunicorn saga_admin.wsgi --bind 0.0.0.0:${{PORT:-8000}} {options} --access-logfile - "
        "--forwarded-allow-ips '*'"
    )


def _granian(options: str) -> str:
    return (
        f"granian --interface wsgi --host 0.0.0.0 --port ${{PORT:-8000}} {options} --access-log --no-ws "
        "saga_admin.wsgi:application"
    )


SERVERS: dict[str, str] = {
    "gunicorn sync, 3 workers": _gunicorn("--workers 3"),
    "gunicorn sync, 5 workers": _gunicorn("--workers 5"),
    "gunicorn gthread, 2 workers x 4 threads": _gunicorn("--workers 2 --worker-class gthread --threads 4"),
    "gunicorn gthread, 4 workers x 4 threads": _gunicorn("--workers 4 --worker-class gthread --threads 4"),
    "granian, 2 workers x 4 blocking threads": _granian("--workers 2 --blocking-threads 4"),
    "granian, 4 workers x 2 blocking threads": _granian("--workers 4 --blocking-threads 2"),
}

# The hot-path figures of one server configuration (``hot_path``), in order.
HOT_PATH = {
    "append": "append: record action",
    "floor": "framework floor: GET a run's checkpoints",
    "heartbeat": "heartbeat",
}


# --- The phase ------------------------------------------------------------------------------


def hot_path(h: Harness, web: procs.Proc, keys: list[tuple[str, str]]) -> dict[str, Any]:
    """The hot path's four figures at 16 clients on one running web server: append (record
    an action), the framework floor (GET a run's checkpoints), heartbeat, the full step
    (record with ``start: true`` → succeed)."""
    n = len(keys)
    per_run = 10
    headers = {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(n)}
    # Fresh runs for up to 800 appends/s (a client that runs out records into its last run).
    runs_needed = int(800 * (h.sizes.warmup_s + h.sizes.window_s) / per_run / n) + 2
    out: dict[str, Any] = {}
    runs = fixtures.fresh_runs(keys=keys, per_client=runs_needed)
    params = {"runs": runs, "per_run": per_run, "headers_per_client": headers}
    out["append"] = summarize(h.load("record_action", n, params, web=web), "record_action")
    floor_runs = fixtures.runs_with_checkpoint(keys=keys)
    params = {"runs": floor_runs, "headers_per_client": headers}
    out["floor"] = summarize(h.load("get_checkpoints", n, params, web=web), "checkpoints")
    out["heartbeat"] = summarize(h.load("heartbeat", n, params, web=web), "heartbeat")
    runs = fixtures.fresh_runs(keys=keys, per_client=runs_needed)
    params = {"runs": runs, "per_run": per_run, "headers_per_client": headers}
    result = h.load("full_step", n, params, web=web)
    out["full_step"] = {op: summarize(result, op) for op in ("step", "record_start", "succeed")}
    return out


def phase(h: Harness) -> None:
    s = h.section("servers")
    keys = fixtures.agent_keys(tenant_slug="bench-servers", count=max(CLIENT_COUNTS))
    fixtures.load_bench_policies(h.log_dir)
    env = h.env_for()
    procfile = procs.web_command()
    procfile_argv = procs.expand(procfile, env)
    configs: list[tuple[str, str]] = [("Procfile", procfile)]
    for name, command in SERVERS.items():
        if procs.expand(command, env) == procfile_argv:
            s["procfile_is"] = name
        else:
            configs.append((name, command))
    if h.sizes.server_candidates is not None:
        gthread = [c for c in configs[1:] if "gthread" in c[1]][:1]
        granian = [c for c in configs[1:] if c[1].startswith("granian")][:1]
        configs = [configs[0], *gthread, *granian][: 1 + h.sizes.server_candidates]
    s["procfile"] = procfile
    measured = s.setdefault("configs", {})
    for i, (name, command) in enumerate(configs):
        log(f"servers: {name}: append, floor, heartbeat, full step; {len(keys)} clients")
        web = h.start_web(f"web-server-{i}", command=command)
        try:
            measured[name] = {"command": command, **hot_path(h, web, keys)}
        finally:
            web.stop()


# --- The report -----------------------------------------------------------------------------


def rows(servers: dict[str, Any], base: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    procfile = servers.get("configs", {}).get("Procfile")
    if procfile:
        limit = machine_limit(base, 16)
        for key, label in HOT_PATH.items():
            rows.append(
                measured_row(f"hot path, Procfile's server: {label} (16 clients)", procfile.get(key), limit)
            )
        step = procfile.get("full_step", {})
        rows.append(
            measured_row(
                "hot path, Procfile's server: full step, record(start) → succeed (16 clients)",
                step.get("step"),
                limit / 2 if limit else None,
            )
        )
    return rows


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The hot path's restated targets, from the Procfile's server in the servers section (append,
    floor, heartbeat and full step measured one after another on the same running server) and
    the baselines of the same run."""
    sec = results.get("sections", {})
    out: list[tuple[str, str, bool | None]] = []
    hot = sec.get("servers", {}).get("configs", {}).get("Procfile")
    limit = machine_limit(sec.get("baselines", {}), 16)
    if not hot:
        out.append(("hot path on the Procfile's server (targets)", "not measured", None))
    else:
        append, floor, heartbeat = hot["append"], hot["floor"], hot["heartbeat"]
        if limit:
            ratio = append["throughput"] / limit
            out.append(
                (
                    "append (16 clients) ≥ 0.10 of min(L1, L2)",
                    f"{append['throughput']:,.0f}/s = {ratio:.2f} of {limit:,.0f}/s",
                    ratio >= 0.10,
                )
            )
        else:
            out.append(("append (16 clients) ≥ 0.10 of min(L1, L2)", "baselines not measured", None))
        floor_ratio = ratio_of(append["throughput"], floor["throughput"]) or 0.0
        out.append(
            (
                "append ≥ 0.60 of the framework floor (GET a run's checkpoints, same server, 16 clients)",
                f"{append['throughput']:,.0f}/s vs {floor['throughput']:,.0f}/s = {floor_ratio:.2f}",
                floor_ratio >= 0.60,
            )
        )
        out.append(("append p99 ≤ 150 ms", f"p99 {append['p99_ms']:.1f} ms", append["p99_ms"] <= 150))
        out.append(
            (
                "append: zero errors",
                f"{append['errors']} errors {append.get('error_detail') or ''}".strip(),
                append["errors"] == 0,
            )
        )
        hb_ratio = ratio_of(heartbeat["throughput"], floor["throughput"]) or 0.0
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
    return out


def markdown(servers: dict[str, Any], base: dict[str, Any]) -> list[str]:
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
    limit = machine_limit(base, 16)
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
            fmt(append["throughput"]),
            f"{append['p50_ms']:.1f} / {append['p99_ms']:.1f}",
            fmt(floor["throughput"]),
            fmt(heartbeat["throughput"]),
            fmt(step.get("throughput")),
            f"{step.get('p50_ms', 0):.1f} / {step.get('p99_ms', 0):.1f}",
            f"{ratio_of(append['throughput'], floor['throughput']) or 0:.2f}",
            f"{ratio_of(heartbeat['throughput'], floor['throughput']) or 0:.2f}",
            f"{ratio_of(append['throughput'], limit) or 0:.3f}",
            fmt(append.get("server_cpu_ms_per_request"), 2),
            fmt(errors),
        ]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Command lines (the Procfile's with its defaults; `PORT` from the environment):", ""]
    for name, c in configs.items():
        out.append(f"- {name}: `{c['command']}`")
    out.append("")
    return out
