"""Fixtures for the recovery engine: a throwaway Redis (so tests may stop it), a signed-webhook
test server, real `saga_worker` processes, and the onboarding saga from the design story."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import (  # noqa: F401 - re-exported for the engine tests
    FAST_ENGINE,
    ROOT,
    Call,
    RedisServer,
    Reply,
    WebhookServer,
    Worker,
    dump_worker_logs,
    free_port,
    rq_pointed_at,
    serve_webhooks,
    spawn_worker,
    wait_for,
)

# --- A Redis of our own ----------------------------------------------------------------------


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
    """Every recovery test talks to the throwaway Redis, started again if a test stopped it."""
    if redis_server.process is None:
        redis_server.start()
    import redis

    redis.Redis.from_url(redis_server.url).flushdb()
    yield redis_server
    if redis_server.process is None:
        redis_server.start()


# --- A compensating service that checks signatures -------------------------------------------


HR_PATH = "/hr/delete_user"
WS_PATH = "/workspace/cancel_license"


@pytest.fixture
def webhooks() -> Iterator[WebhookServer]:
    with serve_webhooks({HR_PATH: "hr-secret", WS_PATH: "ws-secret"}) as server:
        yield server


# --- Real worker processes -------------------------------------------------------------------


@pytest.fixture
def start_worker(
    transactional_db: Any, redis_server: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(**extra_env: str) -> Worker:
        worker = spawn_worker(
            redis_url=redis_server.url, log_path=tmp_path / f"worker-{len(started)}.log", env=extra_env
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


# --- The onboarding saga -----------------------------------------------------------------------


@dataclass
class Saga:
    run: Any
    create_user: Any
    provision_license: Any
    send_welcome: Any
    item: Any = None


def load_onboarding_policies(
    *,
    license_risk: str = "medium",
    license_approval: str = "auto",
    webhooks: WebhookServer | None = None,
    auto_compensate: str | None = None,
) -> None:
    from ledger.models import Compensator, PolicySet, ToolPolicy

    ToolPolicy.objects.create(
        tool="hr.create_user",
        risk="medium",
        approval="auto",
        action_class="internal_update",
        compensation="custom",
    )
    ToolPolicy.objects.create(
        tool="workspace.provision_license",
        risk=license_risk,
        approval=license_approval,
        action_class="external_reversible",
        compensation="custom",
    )
    ToolPolicy.objects.create(
        tool="email.send_welcome",
        risk="low",
        approval="auto",
        action_class="external_irreversible",
        compensation="none",
    )
    # Compensating tools have explicit, automatic policies (their risk is the forward action's).
    for tool in ("hr.delete_user", "workspace.cancel_license"):
        ToolPolicy.objects.create(
            tool=tool, risk="low", approval="auto", action_class="internal_update", compensation="none"
        )
    if webhooks is not None:
        Compensator.objects.create(
            tool="hr.delete_user", kind="webhook", url=webhooks.url(HR_PATH), secret="hr-secret"
        )
        Compensator.objects.create(
            tool="workspace.cancel_license", kind="webhook", url=webhooks.url(WS_PATH), secret="ws-secret"
        )
    PolicySet.objects.create(
        tenant=None,
        default_policy={},
        unwind={"on_compensation_failure": "alert_and_continue", "max_attempts": 5},
        auto_compensate={"max_risk": auto_compensate},
    )


def _perform(
    run: Any,
    agent: Any,
    *,
    tool: str,
    key: str,
    args: dict[str, Any],
    target: str,
    compensation: dict[str, Any] | None,
    after: Any = None,
    fail: str = "",
) -> Any:
    from ledger import services as ledger
    from recovery import services

    recorded = services.action_record_gated(
        run=run,
        actor=agent,
        tool=tool,
        idempotency_key=key,
        target_type="user",
        target_id=target,
        args=args,
        compensation=compensation,
        before_snapshot=None,
    )
    action = recorded.action
    ledger.action_start(action=action, actor=agent)
    if fail:
        return services.action_fail_and_queue(
            action=action, actor=agent, error=fail, retryable=True, layer="tool"
        )
    return ledger.action_succeed(action=action, actor=agent, result={"ok": True}, after_snapshot=after)


def onboarding_saga(tenant: Any, agent: Any, *, fail_run: bool = True) -> Saga:
    """hr.create_user and workspace.provision_license succeed, email.send_welcome fails (step 3)."""
    from ledger import services as ledger
    from recovery import services

    email = "ashu@company.com"
    run = ledger.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    create_user = _perform(
        run,
        agent,
        tool="hr.create_user",
        key=f"{run.pk}-1",
        args={"name": "Ashu Kumar"},
        target=email,
        compensation={"tool": "hr.delete_user", "args": {"email": email}},
        after={"user": email, "active": True},
    )
    provision = _perform(
        run,
        agent,
        tool="workspace.provision_license",
        key=f"{run.pk}-2",
        args={"sku": "business-standard"},
        target=email,
        compensation={"tool": "workspace.cancel_license", "args": {"email": email}},
        after={"license": "business-standard"},
    )
    welcome = _perform(
        run,
        agent,
        tool="email.send_welcome",
        key=f"{run.pk}-3",
        args={"to": "ashu@home.example"},
        target=email,
        compensation=None,
        fail="email gateway rate-limited (429)",
    )
    saga = Saga(run=run, create_user=create_user, provision_license=provision, send_welcome=welcome)
    if fail_run:
        outcome = services.run_fail_and_queue(
            run=run, actor=agent, error="email gateway rate-limited", failed_action=welcome
        )
        saga.item = outcome.item
        saga.run.refresh_from_db()
    return saga
