"""``make bench``'s refusals phase (its section: "Unauthenticated requests"): what a POST without
a valid key costs the Procfile's web line, a tiny body and a 1 MiB one, beside the same megabyte
with a valid key (read, parsed and checked, then refused with a 422)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench import fixtures
from bench.stats import log, summarize
from bench.tables import fmt, load_row, ratio_of

if TYPE_CHECKING:
    from bench.harness import Harness

# The refusal figures, in the order they are measured and shown.
REFUSALS = {
    "tiny_no_key": "POST without a key, tiny body",
    "megabyte_no_key": "POST without a key, 1 MiB body",
    "tiny_unknown_key": "POST with an unknown key, tiny body",
    "megabyte_unknown_key": "POST with an unknown key, 1 MiB body",
    "megabyte_valid_key": "POST with a valid key, 1 MiB body (read and parsed; 422)",
}


# --- The phase ------------------------------------------------------------------------------


def phase(h: Harness) -> None:
    """POSTs without a valid key, tiny and 1 MiB, against the Procfile's web line: the gate
    refuses them from the headers, so the megabyte must cost about what the tiny one does. The
    same megabyte with a valid key (read, parsed and checked, then a 422) is measured beside
    them: it is what every unauthenticated megabyte cost before the key came first."""
    s = h.section("unauthenticated")
    (_, secret), *_ = fixtures.agent_keys(tenant_slug="bench-refusals", count=1)
    unknown = "sk_0123456789ab_" + "x" * 43
    cases = [
        ("tiny_no_key", "tiny", {}, 401),
        ("megabyte_no_key", "megabyte", {}, 401),
        ("tiny_unknown_key", "tiny", {"Authorization": f"Bearer {unknown}"}, 401),
        ("megabyte_unknown_key", "megabyte", {"Authorization": f"Bearer {unknown}"}, 401),
        ("megabyte_valid_key", "megabyte", {"Authorization": f"Bearer {secret}"}, 422),
    ]
    web = h.start_web("web-unauthenticated")
    try:
        for name, body, headers, expected in cases:
            log(f"refusals: {name}, 1 client")
            params = {
                "op": name,
                "path": "/api/v1/runs",
                "body": body,
                "headers": headers,
                "expected": expected,
            }
            s[name] = summarize(h.load("post_raw", 1, params, web=web), name)
    finally:
        web.stop()


# --- The report -----------------------------------------------------------------------------


def rows(refusals: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for key, label in REFUSALS.items():
        entry = refusals.get(key)
        if entry:
            # Compared with the tiny body sent the same way (no key, or the same unknown key).
            twin = "tiny_unknown_key" if key == "megabyte_unknown_key" else "tiny_no_key"
            ratio = ratio_of(entry.get("p50_ms"), refusals.get(twin, {}).get("p50_ms"))
            rows.append(
                load_row(
                    f"refusal: {label}", entry, f"p50 {ratio:.1f}x the tiny one" if ratio is not None else "–"
                )
            )
    return rows


def targets(sec: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
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


def markdown(sec: dict[str, Any]) -> list[str]:
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
                f"{e['p95_ms']:.2f} ms, server CPU {fmt(e.get('server_cpu_ms_per_request'), 2)} ms/request, "
                f"client CPU {e['client_cpu_s']:.1f} s, errors {e['errors']} {e.get('error_detail') or ''}"
            )
    return out
