"""The profiling tools behind docs/BENCHMARKS.md's issue 39 figures, run small so they cannot rot.

``bench.unwind_profile`` (a one-step unwind taken apart, in process and on a real Procfile worker
under py-spy) and ``bench.worker_classes --pass-only`` (the periodic pass beside an outbox of
history). No timing is asserted: what is checked is that each measures what it says (the steps it
ran were done, the statements were counted, the idle pass left the history alone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.processes import ROOT, database_url_for_subprocesses

pytestmark = pytest.mark.slow


def _run(module: list[str], *, database: str, redis_url: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update({"BENCH_DATABASE_URL": database_url_for_subprocesses(database), "REDIS_URL": redis_url})
    completed = subprocess.run(
        [sys.executable, "-m", *module, "--log-dir", str(tmp_path / "logs")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, (completed.stdout[-3000:], completed.stderr[-3000:])
    # Each prints its figures as one indented JSON document (after any one-line log events), then
    # markdown.
    text = completed.stdout
    start = 0 if text.startswith("{\n") else text.index("\n{\n") + 1
    document, _ = json.JSONDecoder().raw_decode(text[start:])
    return document


@pytest.mark.timeout(600)
def test_the_unwind_profile_takes_a_one_step_unwind_apart_in_process_and_on_a_worker(tmp_path, own_redis):
    out = _run(
        ["bench.unwind_profile", "--steps", "4", "--top", "5", "--worker"],
        database=f"saga_bench_uprof_{os.getpid()}",
        redis_url=own_redis.url,
        tmp_path=tmp_path,
    )
    assert out["step_statuses"] == {"done": 4}
    # Every statement is counted (not Django's capped query log): a step records, moves and
    # finishes its unwind, so it runs several.
    assert out["statements_per_step"] > 10
    assert out["statement_kinds_per_step"]["INSERT ledger_event"] >= 1
    assert len(out["top_cumulative"]) == 5
    assert out["rq_noop_in_process"]["jobs"] >= 4
    worker = out["worker"]
    assert worker["step_statuses"] == {"done": 4}
    assert worker["receiver_calls"] >= 4
    spied = worker["py_spy"]
    assert spied["main_thread_samples"] > 0
    assert {p["frame"] for p in spied["parts"]} >= {"unwind_advance (runner.py)", "dequeue_job_and_maintain_ttl"}


@pytest.mark.timeout(600)
def test_the_periodic_pass_is_measured_beside_an_outbox_of_history_it_leaves_alone(tmp_path, own_redis):
    out = _run(
        ["bench.worker_classes", "--pass-only", "--outbox", "400", "--backlog", "50"],
        database=f"saga_bench_pass_{os.getpid()}",
        redis_url=own_redis.url,
        tmp_path=tmp_path,
    )
    periodic = out["periodic pass"]
    assert periodic["outbox_history"] == 400
    assert "ledger_action" in periodic["table_rows"]
    # None of the history is due: the idle pass asks its questions and hands nothing out.
    assert periodic["idle_pass_queries"] > 0
    # The backlog of lost rows is read in bounded batches and handed back.
    assert sum(periodic["sweep_read"]) >= 50
    assert sum(periodic["sweep_reenqueued"]) >= 50
