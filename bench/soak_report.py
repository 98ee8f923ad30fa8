"""The soak's section of the benchmark report (bench/soak.py measures it): targets,
rows of the one table, and the Markdown section, after bench/tables.py's conventions."""

from __future__ import annotations

from typing import Any


def server_errors(section: dict[str, Any]) -> dict[str, int]:
    """The 5xx answers the agents and the operator got, by op and status."""
    found: dict[str, int] = {}
    answers = [
        section.get("load", {}).get("error_detail", {}),
        section.get("operator", {}).get("statuses", {}),
    ]
    for counts in answers:
        for key, count in counts.items():
            status = key.rpartition(":")[2]
            if status.isdigit() and int(status) >= 500:
                found[key] = found.get(key, 0) + count
    return found


def targets(section: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The soak's targets: (target, what was measured, met?) — None when not measured."""
    if not section.get("compensation"):
        return [("Soak: undo keeps up under load and faults", "not measured", None)]
    sizes = section["sizes"]
    comp, idem, untouched = section["compensation"], section["idempotency"], section["untouched"]
    last = comp["last_done_after_load_s"]
    compensated_ok = comp["failed_runs"] > 0 and comp["late_or_missing"] == 0
    key_ok = (
        idem["calls_without_key"] == 0
        and idem["calls_with_a_foreign_key"] == 0
        and idem["actions_with_several_keys"] == 0
        and idem["actions_with_several_effects"] == 0
        and idem["done_without_a_call"] == 0
    )
    errors = server_errors(section)
    return [
        (
            f"soak: every failed run compensated within {sizes['deadline_s']:.0f} s of the load's end, "
            "one worker",
            f"{comp['compensated']}/{comp['failed_runs']} compensated; {comp['late_or_missing']} late or not at all; "
            + (f"last done {last:+.1f} s after the load" if last is not None else "none done"),
            compensated_ok,
        ),
        (
            "soak: one idempotency key per undo, its effect once at the tool",
            f"{idem['calls']} calls, {idem['actions_called']} actions; {idem['calls_without_key']} without a key, "
            f"{idem['calls_with_a_foreign_key']} with another step's key, {idem['actions_with_several_keys']} actions "
            f"with several keys, {idem['actions_with_several_effects']} with several effects, "
            f"{idem['done_without_a_call']} done without a call",
            key_ok,
        ),
        (
            "soak: no succeeded run touched",
            f"{untouched['touched']} of {untouched['succeeded_runs']} succeeded runs touched",
            untouched["touched"] == 0 and untouched["succeeded_runs"] > 0,
        ),
        (
            "soak: no unexpected 5xx",
            ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())) or "none",
            not errors,
        ),
    ]


def rows(section: dict[str, Any]) -> list[list[str]]:
    """The one table's rows (HEADER's columns less the server CPU one, which report adds)."""
    load = section.get("load")
    if not load:
        return []
    lat = section.get("latency", {})
    out = [
        [
            f"soak: agents' API calls under faults ({section['sizes']['agents']} agents)",
            str(load["clients"]),
            f"{load['throughput']:,.1f}",
            f"{load['p50_ms']:.2f}",
            f"{load['p95_ms']:.2f}",
            f"{load['p99_ms']:.2f}",
            str(load["errors"]),
            "requests/s",
        ]
    ]
    for name in ("during", "after"):
        entry = lat.get(name, {})
        if entry.get("count"):
            out.append(
                [
                    f"soak: undo latency, decided {name} the load",
                    "1",
                    "–",
                    f"{entry['p50_s'] * 1000:.0f}",
                    "–",
                    f"{entry['p99_s'] * 1000:.0f}",
                    "–",
                    f"{entry['count']} runs; decision to last step done",
                ]
            )
    return out


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


def markdown(section: dict[str, Any]) -> list[str]:
    out = [
        "",
        "## Soak",
        "",
        "The soak (`bench/soak.py`): undo keeps up under load and faults. Agents, each with its own key, record "
        "onboarding sagas over the API (the Procfile's web line): create the HR record, provision the licence, send "
        "the welcome email, each recorded with `start: true` and succeeded; every third saga fails (at the email, "
        "or every other time at the licence: two or one steps to undo) and the run is failed into the recovery "
        "queue. An operator, through the API with an operator key, compensates each open item as it appears "
        "(polling every 0.5 s, oldest first; an item an unwind reopened is compensated again). One `saga_worker` "
        "process (the Procfile's line, `SAGA_SWEEP_INTERVAL_S=5`, the engine's other clocks at their defaults), "
        "restarted a second after it exits as a process supervisor would, calls the tools' webhook compensators: "
        "a signed-webhook World in the harness that applies each undo once per `Idempotency-Key` and counts per "
        "action what it received. The worker and its work horses are SIGKILLed mid-load; the soak's own "
        'redis-server (never the machine\'s) is stopped and started again empty (`--save ""`). Latency: an '
        "unwind's `created_at` (the operator's decision) to the `finished_at` of the unwind that compensated the "
        'run; "during" when the decision came before the load\'s end.',
        "",
    ]
    if not section.get("compensation"):
        return [*out, "Not measured in this run.", ""]
    sizes, comp, idem = section["sizes"], section["compensation"], section["idempotency"]
    runs, lat, untouched = section["runs"], section["latency"], section["untouched"]
    events = "; ".join(f"{e['event']} at {e['at_s']:.1f} s" for e in section.get("events", [])) or "none"
    exits = (
        ", ".join(f"{x['at_s']:.1f} s (rc {x['returncode']})" for x in section["worker"]["exits"]) or "none"
    )
    load = section["load"]
    before, after = section.get("load_before"), section.get("load_after")
    out += [
        f"- Script: {sizes['agents']} agents for {sizes['duration_s']:.0f} s; faults: {events}.",
        f"- Worker exits (each restarted after 1 s): {exits}.",
        f"- Machine load average (1, 5, 15 min) before/after the load: {before} / {after}.",
        f"- Agents: {load['requests_total']:,} requests, {load['throughput']:,.1f}/s; answers by status "
        + ", ".join(f"{k}: {v:,}" for k, v in sorted(section.get("agent_statuses", {}).items()))
        + ".",
        f"- Runs: {runs['total']:,} ({', '.join(f'{k} {v:,}' for k, v in sorted(runs['by_status'].items()))}); "
        f"{runs['queued']:,} went to the recovery queue.",
        f"- Operator: {section['operator']['decisions']:,} compensations in {section['operator']['polls']:,} polls; "
        + ", ".join(f"{k}: {v:,}" for k, v in sorted(section["operator"]["statuses"].items()))
        + ".",
        f"- Unwinds: {comp['unwinds']:,} ({', '.join(f'{k} {v}' for k, v in sorted(comp['unwind_statuses'].items()))}); "
        f"steps {', '.join(f'{k} {v}' for k, v in sorted(comp['step_statuses'].items()))}; "
        f"{comp['re_decided_runs']} runs compensated more than once.",
        f"- Compensated: {comp['compensated']:,} of {comp['failed_runs']:,} failed runs; the last one "
        + (
            f"{comp['last_done_after_load_s']:+.1f} s after the load's end"
            if comp["last_done_after_load_s"] is not None
            else "never"
        )
        + f" (target ≤ {sizes['deadline_s']:.0f} s); {comp['late_or_missing']} late or not compensated when the "
        f"harness stopped watching ({section['settled_observed_s']:.0f} s after the load).",
        f"- At the tools: {idem['calls']:,} calls under {idem['keys']:,} keys for {idem['actions_called']:,} "
        f"actions; {idem['calls_without_key']} without a key, {idem['calls_with_a_foreign_key']} with a key that "
        f"is not the step's, {idem['actions_with_several_keys']} actions under several keys, "
        f"{idem['actions_with_several_effects']} with more than one effect, {idem['done_without_a_call']} steps "
        f"done without a call, {idem['overlapping_calls']} calls while the same key was in flight.",
        f"- Succeeded runs touched: {untouched['touched']} of {untouched['succeeded_runs']:,}.",
        "",
        "| undo latency (decision → last step done) | runs | p50 | p99 | max |",
        "|---|---|---|---|---|",
    ]
    for name, label in (("during", "decided during the load"), ("after", "decided after it"), ("all", "all")):
        e = lat[name]
        out.append(f"| {label} | {e['count']} | {_s(e['p50_s'])} | {_s(e['p99_s'])} | {_s(e['max_s'])} |")
    out.append("")
    return out
