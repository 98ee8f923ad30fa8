"""The soak, shortened: the harness of `make bench`'s soak phase (bench/soak.py), run as
`bench.run --only soak` with 20 s of load by 4 agents, the worker SIGKILLed at 6 s and the soak's
own Redis down for 3 s at 12 s, and its targets asserted.

The harness observes instead of waiting: it polls PostgreSQL until every failed run is compensated,
up to a generous observation limit (a loaded machine is slow to start processes), while the
product's target stays what the issue says (compensated within 60 s of the load's end). It leaves
nothing behind: its database is dropped, its redis-server (and with it every key it held), web and
worker processes are stopped, and its logs are in a temporary directory removed afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.soak_report import server_errors, targets
from tests.support.processes import ROOT, database_url_for_subprocesses, free_port

SHORT = [
    "--soak-duration",
    "20",
    "--soak-agents",
    "4",
    "--soak-kill-at",
    "6",
    "--soak-outage-at",
    "12",
    "--soak-outage",
    "3",
    # How long the harness watches after the load (not the target, which stays 60 s).
    "--soak-observe",
    "240",
]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_undo_keeps_up_under_load_a_worker_kill_and_a_redis_outage(own_redis):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        logs = Path(tmp) / "logs"
        harness = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.run",
                "--only",
                "soak",
                *SHORT,
                # The harness's other Redis (flushed at its start; the soak runs on its own).
                "--redis-url",
                own_redis.url,
                "--database-url",
                database_url_for_subprocesses(f"saga_bench_soak_{os.getpid()}"),
                "--port",
                str(free_port()),
                "--out",
                str(Path(tmp) / "BENCHMARKS.md"),
                "--log-dir",
                str(logs),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            stdout, stderr = harness.communicate(timeout=840)
        except subprocess.TimeoutExpired:
            # SIGTERM first: the harness then stops what it started (its processes live in
            # sessions of their own, which a SIGKILL of the harness would leave running).
            harness.terminate()
            stdout, stderr = harness.communicate(timeout=60)
            raise AssertionError(f"the soak did not finish within 840 s:\n{stdout[-3000:]}") from None
        results = json.loads((logs / "results.json").read_text())
        worker_logs = "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(logs.glob("soak-worker-*.log"))
        )
    assert harness.returncode == 0 and not results["errors"], (
        results["errors"],
        stdout[-4000:],
        stderr[-4000:],
    )
    soak = results["sections"]["soak"]
    # Nothing left running: the soak's redis-server(s), web and workers all stopped.
    assert soak["pids"] and not [pid for pid in soak["pids"] if _alive(pid)]
    # The faults happened as scripted, and the supervisor restarted the killed worker.
    assert [e["event"] for e in soak["events"]] == [
        "worker SIGKILLed",
        "Redis stopped",
        "Redis started again, empty",
    ]
    assert soak["worker"]["restarts"] >= 1
    comp, idem, untouched = soak["compensation"], soak["idempotency"], soak["untouched"]
    assert comp["failed_runs"] > 0 and untouched["succeeded_runs"] > 0, soak["runs"]
    context = json.dumps(
        {k: soak[k] for k in ("compensation", "idempotency", "untouched", "latency", "events")}
    )
    # Every failed run compensated within 60 s of the load's end.
    assert comp["compensated"] == comp["failed_runs"] and comp["late_or_missing"] == 0, (
        f"{context}\n{worker_logs}"
    )
    # One idempotency key per undo, its effect once at the tool.
    assert idem["calls_without_key"] == 0 and idem["calls_with_a_foreign_key"] == 0, context
    assert idem["actions_with_several_keys"] == 0 and idem["actions_with_several_effects"] == 0, context
    assert idem["done_without_a_call"] == 0, context
    # No succeeded run touched; no 5xx answered to the agents or the operator.
    assert untouched["touched"] == 0, context
    assert server_errors(soak) == {}, context
    # The report's targets say the same.
    assert all(met for _, _, met in targets(soak)), targets(soak)
