"""Plans under concurrency, through a real server (threads, separate connections, PostgreSQL):
concurrent plans cannot overshoot a limit (each action counted as if recorded alone, a plan all or
nothing), the same plan sent several times at once is recorded once, and two plans that deadlock
on their limits' locks are both recorded (the one PostgreSQL picks is retried from the start)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.db import connections

from ledger.models import Action, Tenant
from tests.factories import charge_policy, load_policy_file

pytestmark = pytest.mark.django_db(transaction=True)


def _client(live_server, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"{live_server.url}/api/v1", timeout=30, headers={"Authorization": f"Bearer {secret}"}
    )


def _runs(live_server, secret: str, count: int) -> list[str]:
    with _client(live_server, secret) as client:
        return [
            client.post("/runs", json={"agent": f"declared-{n}", "request": "Charge"}).json()["id"]
            for n in range(count)
        ]


def _charge(key: str, tool: str = "payments.charge") -> dict[str, Any]:
    return {"tool": tool, "args": {"amount": 100, "currency": "usd"}, "idempotency_key": key}


def _together(
    live_server, secret: str, requests: list[tuple[str, list[dict[str, Any]]]]
) -> list[httpx.Response]:
    """Each (run id, plan) posted from its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(requests))
    responses: list[httpx.Response | None] = [None] * len(requests)

    def post(n: int) -> None:
        run_id, actions = requests[n]
        with _client(live_server, secret) as client:
            barrier.wait()
            responses[n] = client.post(f"/runs/{run_id}/plan", json={"actions": actions})

    threads = [threading.Thread(target=post, args=(n,)) for n in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r is not None for r in responses)
    return [r for r in responses if r is not None]


def test_concurrent_plans_cannot_overshoot_a_denying_limit(live_server, agent_key):
    limits = [{"window": "1h", "per": "tenant", "max_count": 4, "on_exceed": "deny"}]
    load_policy_file({"policies": [charge_policy(limits=limits)]})
    run_ids = _runs(live_server, agent_key[1], 6)
    responses = _together(
        live_server,
        agent_key[1],
        [(run_id, [_charge(f"{run_id}-a"), _charge(f"{run_id}-b")]) for run_id in run_ids],
    )
    # Two plans of two fill the limit of four; each of the others is refused whole.
    assert sorted(r.status_code for r in responses) == [201] * 2 + [403] * 4, [r.content for r in responses]
    assert all(
        r.json()["error"]["details"]["plan_index"] in (0, 1) for r in responses if r.status_code == 403
    )
    assert Action.objects.count() == 4
    assert set(Action.objects.values_list("run_id", flat=True)) == {
        r.json()["actions"][0]["run_id"] for r in responses if r.status_code == 201
    }


def test_the_same_plan_sent_at_once_is_recorded_once(live_server, agent_key, onboarding_policies):
    (run_id,) = _runs(live_server, agent_key[1], 1)
    actions = [
        {"tool": "hr.create_user", "args": {"email": "a@b.c"}, "idempotency_key": "user"},
        {"tool": "workspace.provision_license", "args": {"email": "a@b.c"}, "idempotency_key": "license"},
        {"tool": "email.send_welcome", "args": {"to": "a@b.c"}, "idempotency_key": "welcome"},
    ]
    responses = _together(live_server, agent_key[1], [(run_id, actions)] * 6)
    assert sorted(r.status_code for r in responses) == [200] * 5 + [201], [r.content for r in responses]
    assert len({tuple(a["id"] for a in r.json()["actions"]) for r in responses}) == 1
    assert Action.objects.count() == 3


def _waiting_advisory_locks() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        (count,) = cursor.fetchone()
    return int(count)


def _until(condition: Callable[[], bool], *, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_two_plans_that_deadlock_on_their_limits_are_both_recorded(live_server, agent_key):
    """Plan A records tool X then Y, plan B Y then X, in runs of their own: both take each tool's
    limit lock in turn. Holding Y's lock here, B queues for it first and A (holding X) second;
    released, Y goes to B, which then waits for X: a deadlock, every time. PostgreSQL ends one
    transaction; that plan is recorded again from the start once the other commits."""
    limits = [{"window": "1h", "per": "tenant", "max_count": 100}]
    load_policy_file(
        {
            "policies": [
                charge_policy(tool="payments.x", limits=limits),
                charge_policy(tool="payments.y", limits=limits),
            ]
        }
    )
    run_a, run_b = _runs(live_server, agent_key[1], 2)
    tenant_id = Tenant.objects.get(slug="acme").pk
    # The lock name ledger.services.limits takes for a per-tenant limit of a tool.
    y_lock = f"limit:{tenant_id}:payments.y:tenant:"
    responses: dict[str, httpx.Response] = {}

    def post(name: str, run_id: str, actions: list[dict[str, Any]]) -> None:
        with _client(live_server, agent_key[1]) as client:
            responses[name] = client.post(f"/runs/{run_id}/plan", json={"actions": actions})

    holder = connections.create_connection("default")
    try:
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [y_lock])
        b = threading.Thread(
            target=post, args=("b", run_b, [_charge("b-y", "payments.y"), _charge("b-x", "payments.x")])
        )
        b.start()
        _until(lambda: _waiting_advisory_locks() == 1)
        a = threading.Thread(
            target=post, args=("a", run_a, [_charge("a-x", "payments.x"), _charge("a-y", "payments.y")])
        )
        a.start()
        _until(lambda: _waiting_advisory_locks() == 2)
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [y_lock])
        a.join()
        b.join()
    finally:
        holder.close()
    assert (responses["a"].status_code, responses["b"].status_code) == (201, 201), (
        responses["a"].content,
        responses["b"].content,
    )
    assert Action.objects.count() == 4
