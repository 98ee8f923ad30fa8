"""The benchmark harness, run at smoke size inside `make test` so it cannot rot.

This checks that every phase runs and the report has every section; it asserts no timing
target (a smoke run's figures mean nothing, and this machine is shared while tests run).

Its Redis is the suite's throwaway redis-server (``own_redis``), not ``--redis-url auto``: that
claims a free-looking database among 8-15 of the machine's Redis and flushes it, and in a parallel
run one of those may be another worker's, between two of its tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.report import SECTIONS
from tests.support.processes import ROOT, database_url_for_subprocesses, free_port


def _assert_plans_measured(append: dict, report: str) -> None:
    """The append's actions recorded through plans of 5: counted, error-free, and
    reported as actions per second with the latency per plan."""
    plan = append["record_plan_16"]["record_plan"]
    assert plan["count"] > 0 and plan["errors"] == 0, plan
    assert plan["actions_per_s"] == plan["throughput"] * 5
    assert "actions through plans of 5" in report


def _check_unwinds(unwind: dict, images: dict) -> None:
    """The unwinds completed, on the Procfile's worker and on the candidate worker (non-forking,
    one job per step); before-images: both governed calls timed, every checked undo step verified,
    none unchecked."""
    assert unwind["single"]["unwind_statuses"] == ["completed"]
    candidates = unwind["candidates"].values()
    assert candidates and all(c["single"]["unwind_statuses"] == ["completed"] for c in candidates)
    assert images["governed"]["steps"] > 0 and images["governed"]["with_p50_ms"] > 0
    checked, unchecked = images["undo"]["checked"], images["undo"]["unchecked"]
    assert checked["verified"] == checked["steps"] > 0 and checked["statuses"] == ["done"]
    assert unchecked["verified"] == 0 and unchecked["statuses"] == ["done"]


def _results_of(completed: subprocess.CompletedProcess[str], written) -> dict:
    # A harness that died before its figures were written says why (its own output).
    assert written.exists(), (completed.returncode, completed.stdout[-4000:], completed.stderr[-4000:])
    return json.loads(written.read_text())


# The soak phase adds about a minute at smoke size: its own web and worker start. About 8 minutes
# beside the rest of the suite on 2 cores; 12 when the machine is busier still (a fresh clone's
# CI beside other work took more than 11). The bound catches a harness that hangs; it is no target.
@pytest.mark.timeout(1020)
def test_it_runs_every_phase_and_writes_a_report_with_every_section(tmp_path, own_redis):
    out = tmp_path / "BENCHMARKS.md"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.run",
            "--smoke",
            "--redis-url",
            own_redis.url,
            "--database-url",
            # Its own database on the suite's server (DATABASE_URL's), created and dropped by the run.
            database_url_for_subprocesses(f"saga_bench_smoke_{os.getpid()}"),
            "--port",
            str(free_port()),
            "--out",
            str(out),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1000,
    )
    results = _results_of(completed, tmp_path / "logs" / "results.json")
    failed = {e["phase"]: e["traceback"] for e in results["errors"]}
    assert completed.returncode == 0 and not failed, (
        failed,
        completed.stdout[-4000:],
        completed.stderr[-4000:],
    )

    report = out.read_text()
    for section in SECTIONS:
        assert f"## {section}" in report
    assert "Smoke run" in report
    sections = results["sections"]
    assert {"L1_1", "L1_16", "L2_1", "L2_16", "L3_batch", "L3_chain"} <= set(sections["baselines"])
    assert {"record_action_1", "record_action_16", "action_lifecycle_1", "action_lifecycle_16"} <= set(
        sections["append"]
    )
    assert sections["append"]["record_action_16"]["record_action"]["count"] > 0
    # The same append on a tool whose policy has two limits, counted and error-free.
    limited = sections["append"]["record_action_limited_16"]["record_action"]
    assert limited["count"] > 0 and limited["errors"] == 0
    assert "tool with 2 limits" in report
    _assert_plans_measured(sections["append"], report)
    # The append with traces off, on (exported to a local OTLP sink) and off again, the
    # exported spans decoded: each recorded call's execute_tool span among them.
    traces = sections["traces"]
    assert all(traces[r]["record_action_16"]["count"] > 0 for r in ("off", "on", "off_again"))
    assert traces["on"]["record_action_16"]["errors"] == 0
    assert traces["exported"]["by_name"].get("execute_tool", 0) > 0
    # A record with just under 1 MiB of args beside a small one, both recorded,
    # for a tool that needs no approval and for one that waits for a person.
    sizes = sections["record_size"]
    assert set(sizes) == {"small", "megabyte", "small_gated", "megabyte_gated"}
    assert all(entry["errors"] == 0 for entry in sizes.values()), sizes
    assert sizes["small"]["count"] > 0 and sizes["small_gated"]["count"] > 0
    assert "a tool that waits for a person" in report
    _check_audit_stream(sections["audit_stream"], report)
    # Requests without a key are refused (401) from their headers, a megabyte body or not; the same
    # megabyte with a valid key is read and judged (422).
    refusals = sections["unauthenticated"]
    assert set(refusals) == {
        "tiny_no_key",
        "megabyte_no_key",
        "tiny_unknown_key",
        "megabyte_unknown_key",
        "megabyte_valid_key",
    }
    assert all(r["count"] > 0 and r["errors"] == 0 for r in refusals.values()), refusals
    assert set(sections["dashboard"]["timings"]) == set(sections["dashboard"]["explain"])
    assert all(t["count"] > 0 and t["errors"] == 0 for t in sections["dashboard"]["timings"].values())
    _check_unwinds(sections["unwind"], sections["images"])
    dashboard = sections["dashboard"]
    assert set(dashboard["explain_without_bench_indexes"]) == set(dashboard["explain"])
    # Servers: the Procfile's web line and a gunicorn gthread and a granian candidate each served
    # the whole hot path (append, floor, heartbeat, full step) without an error.
    servers = sections["servers"]["configs"]
    assert "Procfile" in servers and len(servers) == 3, servers.keys()
    commands = [c["command"] for c in servers.values()]
    assert any("gthread" in c for c in commands) and any(c.startswith("granian") for c in commands)
    for name, config in servers.items():
        for figure in ("append", "floor", "heartbeat"):
            assert config[figure]["count"] > 0 and config[figure]["errors"] == 0, (name, figure, config)
        step = config["full_step"]["step"]
        assert step["count"] > 0 and step["errors"] == 0, (name, config["full_step"])
    _check_reads(sections["reads"], report)
    _check_workers(sections["workers"])
    _check_bulk(sections["bulk"], report)
    _check_size(sections["size"], report)
    _check_soak(sections["soak"], report)
    # The table printed to the terminal is the same one the report carries.
    assert "figure" in completed.stdout and "Targets:" in completed.stdout


def _check_reads(reads: dict, report: str) -> None:
    """Every read measured beside the append on one server, error-free, one
    query each; the run page with 200 and 5,000 actions, its Load more and its trail, timed and
    counted, the page's queries the same for both lengths."""
    api = reads["api"]
    for op in ("append", "checkpoints", "run", "actions", "runs", "append_again"):
        assert api[op]["count"] > 0 and api[op]["errors"] == 0, (op, api[op])
    assert all(api["queries"][op]["queries"] == 1 for op in ("checkpoints", "run", "actions", "runs"))
    pages = reads["pages"]
    for actions in ("200", "5,000"):
        names = [n for n in pages if n.startswith(f"run page ({actions} actions)")]
        assert any("Load more" in n for n in names) and any("trail" in n for n in names), names
    assert all(p["count"] > 0 and p["errors"] == 0 and p["queries"] > 0 for p in pages.values()), pages
    assert pages["run page (200 actions)"]["queries"] == pages["run page (5,000 actions)"]["queries"]
    assert "## Reads" in report and "x the append" in report


def _check_audit_stream(stream: dict, report: str) -> None:
    """The append before the audit stream, with it off and on (a worker streaming to a syslog sink)."""
    assert all(stream[mode]["count"] > 0 and stream[mode]["errors"] == 0 for mode in ("before", "off", "on"))
    assert stream["frames_received"] > 0 and "audit stream on (syslog sink)" in report


def _check_size(size: dict, report: str) -> None:
    """The 'at size' phase: its own database seeded with chains that verify, every page
    and API list served without an error and EXPLAINed, the append and the governed call measured,
    and retention measured or said to be not available."""
    assert size["seed"]["counts"]["actions"] > 0 and size["seed"]["counts"]["events"] > 0
    assert size["check"]["ok"], size["check"]
    assert size["timings"] and set(size["timings"]) == set(size["explain"])
    assert set(size["api_timings"]) == set(size["api_explain"])
    for t in (*size["timings"].values(), *size["api_timings"].values()):
        assert t["count"] > 0 and t["errors"] == 0, t
    assert any("5" in name or "500" in name for name in size["timings"] if name.startswith("run detail"))
    for n in (1, 16):
        assert size[f"append_{n}"]["count"] > 0 and size[f"append_{n}"]["errors"] == 0
    assert size["governed"]["steps"] > 0
    assert "ledger_event" in size["sizes_before"] and size["sizes_before"]["database"] > 0
    retention = size["retention"]
    assert retention["available"] or "archiver not available" in retention["note"]
    assert "## At size" in report and "governance adds" in report


def _check_bulk(bulk: dict, report: str) -> None:
    """Bulk decisions by filter: every preview counted the seeded items, the bulk closed
    each of them on the worker (none failed or skipped) while the append ran, and the in-process
    profile decided its own items; the report states the three targets."""
    items = bulk["items"]
    assert bulk["preview"]["counts"] == [items] and not bulk["preview"]["errors"], bulk["preview"]
    assert bulk["preview"]["samples"] > 0 and bulk["preview"]["p95_ms"] > 0
    run = bulk["bulk"]
    assert run["status"] == "finished" and run["done"] == run["total"] == items, run
    assert run["failed"] == run["skipped"] == 0 and run["seconds"] > 0, run
    assert bulk["database"] == {"resolved/closed": items}, bulk["database"]
    for load in ("append_before", "append_during"):
        assert bulk[load]["count"] > 0 and bulk[load]["errors"] == 0, (load, bulk[load])
    # The load's window was the bulk's: it ended when the poll saw the bulk finish.
    assert bulk["append_during"]["window_s"] <= run["observed_s"] + 1, (bulk["append_during"], run)
    profile = bulk["profile"]
    assert profile["done"] == profile["items"] and profile["queries_per_item"] > 0, profile
    for target in ("bulk preview of a filter matching", "close decisions in <", "while the bulk runs"):
        assert target in report, target


def _check_soak(soak: dict, report: str) -> None:
    """The soak ran its script at smoke size: load, the worker killed, Redis down and up
    again; its targets are asserted by tests/bench/test_soak.py on a longer window."""
    assert [e["event"] for e in soak["events"]] == [
        "worker SIGKILLed",
        "Redis stopped",
        "Redis started again, empty",
    ]
    assert soak["runs"]["total"] > 0 and "soak: no succeeded run touched" in report


def _check_workers(workers: dict, counts: set[str] | None = None) -> None:
    """Every webhook step was carried out (signed, answered) by 1, 2 and 4 processes (the no-op
    trial: by 1)."""
    if counts is None:
        _check_workers(workers["noop"], {"1"})
    trials = workers["trials"]
    assert set(trials) == (counts or {"1", "2", "4"})
    for trial in trials.values():
        assert trial["unwind_statuses"] == ["completed"] and trial["receiver_refused"] == 0, trial
        assert trial["receiver_calls"] == trial["steps"] == workers["steps"], trial
    if "4" in trials:  # four processes took steps at once (the no-op trial has one)
        assert trials["4"]["receiver_max_concurrent"] > 1, trials
