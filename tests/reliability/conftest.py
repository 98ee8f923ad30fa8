"""Fault-injection fixtures: every scenario on the throwaway Redis, a compensating service that
counts effects per Idempotency-Key, workers that can push resume commands, and the results file
(artifacts/reliability.json) that docs/RELIABILITY.md's table is generated from."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from saga_client.signing import derive_secret

from tests.factories import RESUME_PATH, RESUME_SECRET, UNDO_PATH, UNDO_SECRET
from tests.support.parallel import locked
from tests.support.processes import ROOT, WebhookServer, serve_webhooks

RESULTS_PATH = ROOT / "artifacts" / "reliability.json"
# What `manage.py resume_secret --tenant acme --agent onboarding-agent` prints under
# SAGA_RESUME_WEBHOOK_SECRET=RESUME_SECRET (the ``tenant`` fixture is acme, the ``agent`` fixture's
# key is onboarding-agent's).
RESUME_AGENT_SECRET = derive_secret(RESUME_SECRET, "resume:acme:onboarding-agent")


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
    so running one test refreshes only its own row. In a parallel run every worker merges its own
    scenarios in, one worker at a time."""
    collected = Results()
    yield collected
    if not collected.scenarios:
        return
    with locked(RESULTS_PATH):
        previous: dict[str, Any] = {}
        if RESULTS_PATH.exists():
            try:
                previous = json.loads(RESULTS_PATH.read_text())
            except ValueError:
                previous = {}
        merged = {**previous.get("scenarios", {}), **collected.scenarios}
        RESULTS_PATH.write_text(json.dumps({"scenarios": dict(sorted(merged.items()))}, indent=2) + "\n")


# --- Redis, webhooks, workers ----------------------------------------------------------------


@pytest.fixture(autouse=True)
def _every_test_on_the_throwaway_redis(own_redis):
    return own_redis


@pytest.fixture
def hooks(settings: Any) -> Iterator[WebhookServer]:
    """The ``rel.undo`` compensator and the agent's resume URL: a local address, so the operator
    allows it (``SAGA_OUTBOUND_ALLOWED_HOSTS``); the agent verifies pushes with the ``tenant``
    fixture's own resume secret."""
    with serve_webhooks({UNDO_PATH: UNDO_SECRET, RESUME_PATH: RESUME_AGENT_SECRET}) as server:
        settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": [f"127.0.0.1:{server.port}"]}
        yield server


@pytest.fixture
def worker_env() -> dict[str, str]:
    """Workers sign the resume commands they push, for the agent (``hooks``) to verify, and may
    push them to the local webhook server."""
    return {"SAGA_RESUME_WEBHOOK_SECRET": RESUME_SECRET, "SAGA_OUTBOUND_ALLOWED_HOSTS": "127.0.0.1"}
