"""``make bench``'s record size phase: a record with just under 1 MiB of args against a small one,
one client each, on the Procfile's web line; for a tool that needs no approval and for one that
waits for a person."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench import fixtures
from bench.stats import log, summarize
from bench.tables import fmt, load_row, ratio_of

if TYPE_CHECKING:
    from bench.harness import Harness

# A record's cost by the size of its args, in the order they are measured and shown.
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


# --- The phase ------------------------------------------------------------------------------


def phase(h: Harness) -> None:
    """A record with just under 1 MiB of args against a small one, one client each, on the
    Procfile's web line: what a valid key's megabyte costs the server,
    parsed, hashed, stored and echoed back; for a tool that needs no approval and for one that
    waits for a person (its approval binds and stores the args too). The per-key byte budget is set out of reach here,
    as the request rate is."""
    s = h.section("record_size")
    (key_id, secret), *_ = fixtures.agent_keys(tenant_slug="bench-record-size", count=1)
    fixtures.load_bench_policies(h.log_dir)
    web = h.start_web("web-record-size")
    try:
        for name, megabyte, tool in (
            ("small", False, None),
            ("megabyte", True, None),
            # No policy names it: the default policy's approval is opened for each record.
            ("small_gated", False, "unlisted.needs_a_person"),
            ("megabyte_gated", True, "unlisted.needs_a_person"),
        ):
            log(f"record size: {name} args, 1 client")
            params = {
                **({"tool": tool} if tool else {}),
                "runs": fixtures.fresh_runs(keys=[(key_id, secret)], per_client=200),
                "per_run": 10,
                "megabyte": megabyte,
                "op": name,
                "headers_per_client": {0: {"Authorization": f"Bearer {secret}"}},
            }
            s[name] = summarize(h.load("record_action", 1, params, web=web), name)
    finally:
        web.stop()


# --- The report -----------------------------------------------------------------------------


def rows(sizes: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for key, label in RECORD_SIZES.items():
        entry = sizes.get(key)
        if entry:
            cpu_ratio = ratio_of(
                entry.get("server_cpu_ms_per_request"),
                sizes.get("small_gated" if key.endswith("_gated") else "small", {}).get(
                    "server_cpu_ms_per_request"
                ),
            )
            rows.append(
                load_row(
                    f"record size: {label}",
                    entry,
                    f"server CPU {cpu_ratio:.1f}x the small one" if cpu_ratio is not None else "–",
                )
            )
    return rows


def targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    return _checks(sec.get("record_size"))


def _checks(sizes: dict[str, Any] | None) -> list[tuple[str, str, bool | None]]:
    """The 10× target per pair of ``RECORD_SIZE_PAIRS``: server CPU and p50."""
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


def markdown(sec: dict[str, Any]) -> list[str]:
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
                    f"{e['p95_ms']:.2f} ms, server CPU {fmt(e.get('server_cpu_ms_per_request'), 2)} ms/request, "
                    f"client CPU {e['client_cpu_s']:.1f} s, errors {e['errors']} {e.get('error_detail') or ''}"
                )
    return out
