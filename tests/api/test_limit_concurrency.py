"""Limits under concurrency: ten records racing through a real server (threads, separate
connections, PostgreSQL) against a limit of three record exactly three within the limit."""

from __future__ import annotations

import threading

import httpx
import pytest

from ledger.models import Action
from tests.factories import charge_policy, load_policy_file

RACERS = 10


def _race(live_server, secret: str, run_ids: list[str]) -> list[httpx.Response]:
    """One charge per racer, each in its own run (so the run's row lock does not serialise them:
    only the limit's lock may), released together by a barrier."""
    barrier = threading.Barrier(RACERS)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def post(n: int) -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {secret}"}) as client:
            barrier.wait()
            response = client.post(
                f"{live_server.url}/api/v1/runs/{run_ids[n]}/actions",
                json={
                    "tool": "payments.charge",
                    "args": {"amount": 100, "currency": "usd"},
                    "idempotency_key": f"charge-{n}",
                },
            )
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=post, args=(n,)) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(responses) == RACERS
    return responses


def _runs(live_server, secret: str) -> list[str]:
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {secret}"}) as client:
        return [
            client.post(
                f"{live_server.url}/api/v1/runs", json={"agent": f"declared-{n}", "request": "Charge"}
            ).json()["id"]
            for n in range(RACERS)
        ]


@pytest.mark.django_db(transaction=True)
def test_ten_simultaneous_records_against_a_limit_of_three_record_exactly_three_within_it(
    live_server, agent_key
):
    load_policy_file({"policies": [charge_policy(limits=[{"window": "1h", "per": "agent", "max_count": 3}])]})
    responses = _race(live_server, agent_key[1], _runs(live_server, agent_key[1]))
    assert sorted(r.status_code for r in responses) == [201] * RACERS
    statuses = sorted(r.json()["status"] for r in responses)
    assert statuses == ["awaiting_approval"] * 7 + ["planned"] * 3
    within = [r.json() for r in responses if r.json()["status"] == "planned"]
    assert all(a["policy"]["limit"] is None for a in within)
    escalated = [r.json() for r in responses if r.json()["status"] == "awaiting_approval"]
    # Each escalated one saw at least three before it (in commit order).
    assert all(a["policy"]["limit"]["used"] >= 3 for a in escalated)
    assert Action.objects.filter(status="planned").count() == 3


@pytest.mark.django_db(transaction=True)
def test_ten_simultaneous_records_against_a_denying_sum_limit_overshoot_nothing(live_server, agent_key):
    limits = [{"window": "24h", "per": "tenant", "sum_arg": "amount", "max_sum": 300, "on_exceed": "deny"}]
    load_policy_file({"policies": [charge_policy(limits=limits)]})
    responses = _race(live_server, agent_key[1], _runs(live_server, agent_key[1]))
    codes = sorted(r.status_code for r in responses)
    assert codes == [201] * 3 + [403] * 7, [r.content for r in responses]
    assert {r.json()["error"]["code"] for r in responses if r.status_code == 403} == {"policy_denied"}
    assert Action.objects.count() == 3
