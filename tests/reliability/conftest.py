"""Fault-injection fixtures: a throwaway Redis, a compensating service that counts effects per
Idempotency-Key, real ``saga_worker`` processes, sagas with many compensable steps, and the
results file (artifacts/reliability.json) that docs/RELIABILITY.md's table is generated from."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import (
    ROOT,
    RedisServer,
    WebhookServer,
    Worker,
    rq_pointed_at,
    serve_webhooks,
    spawn_worker,
)

RESULTS_PATH = ROOT / "artifacts" / "reliability.json"
UNDO_PATH = "/undo"
RESUME_PATH = "/resume"
UNDO_SECRET = "undo-secret"
RESUME_SECRET = "resume-secret"


# --- Measured results ------------------------------------------------------------------------


@dataclass
class Results:
    scenarios: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self, scenario: str, **counts: Any) -> None:
        self.scenarios[scenario] = {
            **counts,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


@pytest.fixture(scope="session")
def results() -> Iterator[Results]:
    """Each scenario records what it measured; the file keeps the other scenarios' last results,
    so running one test refreshes only its own row."""
    collected = Results()
    yield collected
    if not collected.scenarios:
        return
    previous: dict[str, Any] = {}
    if RESULTS_PATH.exists():
        try:
            previous = json.loads(RESULTS_PATH.read_text())
        except ValueError:
            previous = {}
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    merged = {**previous.get("scenarios", {}), **collected.scenarios}
    RESULTS_PATH.write_text(json.dumps({"scenarios": dict(sorted(merged.items()))}, indent=2) + "\n")


# --- Redis, webhooks, workers ----------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server(django_db_setup: Any) -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        with rq_pointed_at(server):
            yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _own_redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    """Every scenario starts with an empty throwaway Redis, started again if a test stopped it."""
    if redis_server.process is None:
        redis_server.start()
    redis_server.flush()
    yield redis_server
    if redis_server.process is None:
        redis_server.start()


@pytest.fixture
def hooks() -> Iterator[WebhookServer]:
    with serve_webhooks({UNDO_PATH: UNDO_SECRET, RESUME_PATH: RESUME_SECRET}) as server:
        yield server


@pytest.fixture
def workers(transactional_db: Any, redis_server: RedisServer, tmp_path: Path) -> Iterator[list[Worker]]:
    """Every worker a test started (``start_worker`` appends), stopped at the end."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


@pytest.fixture
def start_worker(workers: list[Worker], redis_server: RedisServer, tmp_path: Path) -> Callable[..., Worker]:
    def start(**extra_env: str) -> Worker:
        worker = spawn_worker(
            redis_url=redis_server.url,
            log_path=tmp_path / f"worker-{len(workers)}.log",
            env={"SAGA_RESUME_WEBHOOK_SECRET": RESUME_SECRET, **extra_env},
        )
        workers.append(worker)
        return worker

    return start


# --- Sagas -------------------------------------------------------------------------------------


def load_policies(
    *, hooks: WebhookServer | None = None, max_attempts: int = 10, python_undo: str = ""
) -> None:
    """``rel.do_*`` tools are low-risk and undone by ``rel.undo`` (the webhook, or a Python
    compensator when ``python_undo`` names one)."""
    from ledger.models import Compensator, PolicySet, ToolPolicy

    ToolPolicy.objects.create(
        tool="rel.do_*",
        risk="low",
        approval="auto",
        action_class="external_reversible",
        compensation="custom",
    )
    ToolPolicy.objects.create(
        tool="rel.undo", risk="low", approval="auto", action_class="internal_update", compensation="none"
    )
    if python_undo:
        Compensator.objects.create(tool="rel.undo", kind="python", python_path=python_undo)
    elif hooks is not None:
        Compensator.objects.create(
            tool="rel.undo", kind="webhook", url=hooks.url(UNDO_PATH), secret=UNDO_SECRET
        )
    PolicySet.objects.create(
        tenant=None,
        default_policy={},
        auto_compensate={},
        unwind={"on_compensation_failure": "alert_and_continue", "max_attempts": max_attempts},
    )


@dataclass
class Saga:
    run: Any
    actions: list[Any]
    item: Any


def failed_saga(tenant: Any, agent: Any, *, steps: int = 3, resume_url: str = "") -> Saga:
    """A run whose ``steps`` actions succeeded, each with a compensation, then failed into the
    recovery queue."""
    from ledger import services as ledger
    from recovery import services

    run = ledger.run_create(
        tenant=tenant, actor=agent, agent="reliability", request="change the world", resume_url=resume_url
    )
    actions = []
    for n in range(1, steps + 1):
        action = services.action_record_gated(
            run=run,
            actor=agent,
            tool=f"rel.do_{n}",
            idempotency_key=f"{run.pk}-{n}",
            target_type="thing",
            target_id=f"thing-{n}",
            args={"n": n},
            compensation={"tool": "rel.undo", "args": {"n": n}},
        ).action
        ledger.action_start(action=action, actor=agent)
        actions.append(
            ledger.action_succeed(action=action, actor=agent, result={"ok": n}, after_snapshot={"n": n})
        )
    outcome = services.run_fail_and_queue(run=run, actor=agent, error="step failed")
    run.refresh_from_db()
    return Saga(run=run, actions=actions, item=outcome.item)
