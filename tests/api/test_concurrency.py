"""Identical requests racing through a real server (separate threads, separate connections)."""

from __future__ import annotations

import threading

import httpx
import pytest

from ledger.models import Action, Run

THREADS = 24

ACTION = {
    "tool": "hr.create_user",
    "target_type": "user",
    "target_id": "ashu@company.com",
    "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
    "idempotency_key": "create-ashu",
    "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
}


def _race(url: str, secret: str, body: dict, headers: dict[str, str] | None = None) -> list[httpx.Response]:
    barrier = threading.Barrier(THREADS)
    responses: list[httpx.Response] = []
    lock = threading.Lock()

    def post() -> None:
        with httpx.Client(
            timeout=30, headers={"Authorization": f"Bearer {secret}", **(headers or {})}
        ) as client:
            barrier.wait()
            response = client.post(url, json=body)
        with lock:
            responses.append(response)

    threads = [threading.Thread(target=post) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(responses) == THREADS
    return responses


@pytest.mark.django_db(transaction=True)
def test_identical_concurrent_action_posts_record_exactly_one_action(
    live_server, agent_key, onboarding_policies
):
    secret = agent_key[1]
    run = httpx.post(
        f"{live_server.url}/api/v1/runs",
        json={"agent": "onboarding", "request": "Onboard Ashu"},
        headers={"Authorization": f"Bearer {secret}"},
    ).json()
    responses = _race(f"{live_server.url}/api/v1/runs/{run['id']}/actions", secret, ACTION)

    statuses = sorted(r.status_code for r in responses)
    assert all(s in (200, 201, 409) for s in statuses), statuses
    assert statuses.count(201) == 1
    ids = {r.json()["id"] for r in responses if r.status_code in (200, 201)}
    assert len(ids) == 1
    for response in responses:
        if response.status_code == 409:
            assert response.json()["error"]["code"] == "idempotency_key_in_flight"
        if response.status_code == 200:
            assert response.headers["Idempotent-Replayed"] == "true"
    assert Action.objects.filter(run_id=run["id"]).count() == 1
    assert Run.objects.get(pk=run["id"]).action_count == 1


@pytest.mark.django_db(transaction=True)
def test_identical_concurrent_run_posts_with_one_key_create_one_run(live_server, agent_key):
    responses = _race(
        f"{live_server.url}/api/v1/runs",
        agent_key[1],
        {"agent": "onboarding", "request": "Onboard Ashu"},
        headers={"Idempotency-Key": "run-ashu"},
    )
    statuses = [r.status_code for r in responses]
    assert all(s in (201, 409) for s in statuses), statuses
    created = {r.json()["id"] for r in responses if r.status_code == 201}
    assert len(created) == 1
    assert (
        sum(1 for r in responses if r.headers.get("Idempotent-Replayed") == "true") == statuses.count(201) - 1
    )
    assert Run.objects.count() == 1
