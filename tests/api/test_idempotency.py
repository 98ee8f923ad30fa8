"""The Idempotency-Key header on creating POSTs: replay, reuse, in flight (retention and pruning:
tests/recovery/test_pruning.py)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from ledger.models import Checkpoint, IdempotencyRecord, Run
from saga_admin.api import idempotency
from tests.factories import new_run
from tests.support.api import error_of

pytestmark = pytest.mark.django_db

RUN = {"agent": "onboarding", "request": "Onboard Ashu Kumar"}


def test_the_same_key_and_body_replays_the_original_response(api):
    first = api.post("/runs", RUN, headers={"Idempotency-Key": "create-run-1"})
    # Key order and whitespace do not make it a different request.
    second = api.post(
        "/runs",
        raw='{"request": "Onboard Ashu Kumar",   "agent": "onboarding"}',
        headers={"Idempotency-Key": "create-run-1"},
    )
    assert first.status_code == second.status_code == 201
    assert second["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    assert second.json() == first.json()
    assert Run.objects.count() == 1


def test_the_same_key_with_another_body_is_422(api):
    api.post("/runs", RUN, headers={"Idempotency-Key": "create-run-1"})
    response = api.post("/runs", {**RUN, "external_id": "other"}, headers={"Idempotency-Key": "create-run-1"})
    assert response.status_code == 422
    assert error_of(response)["code"] == "idempotency_key_reused"
    assert Run.objects.count() == 1


def test_the_same_key_on_another_endpoint_is_422(api):
    run = new_run(api)
    api.post(f"/runs/{run['id']}/checkpoints", {"name": "a"}, headers={"Idempotency-Key": "shared"})
    response = api.post(f"/runs/{run['id']}/complete", {"name": "a"}, headers={"Idempotency-Key": "shared"})
    assert response.status_code == 422


def test_keys_are_scoped_per_tenant(api, outsider_api):
    mine = api.post("/runs", RUN, headers={"Idempotency-Key": "same-key"})
    theirs = outsider_api.post("/runs", RUN, headers={"Idempotency-Key": "same-key"})
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]


def test_an_error_is_not_stored_so_the_key_can_be_retried(api):
    run = new_run(api)
    bad = api.post(
        f"/runs/{run['id']}/checkpoints",
        {"name": "cp", "completed_action_ids": ["act_nope"]},
        headers={"Idempotency-Key": "cp-1"},
    )
    assert bad.status_code == 422
    assert not IdempotencyRecord.objects.filter(key="cp-1").exists()
    good = api.post(
        f"/runs/{run['id']}/checkpoints",
        {"name": "cp", "completed_action_ids": ["act_nope"]},
        headers={"Idempotency-Key": "cp-1"},
    )
    assert good.status_code == 422  # still invalid, and still not a replay of anything
    assert "Idempotent-Replayed" not in good


def test_checkpoints_and_run_failure_replay_too(api):
    run = new_run(api)
    first = api.post(f"/runs/{run['id']}/checkpoints", {"name": "cp"}, headers={"Idempotency-Key": "cp-1"})
    again = api.post(f"/runs/{run['id']}/checkpoints", {"name": "cp"}, headers={"Idempotency-Key": "cp-1"})
    assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
    assert Checkpoint.objects.count() == 1

    failed = api.post(f"/runs/{run['id']}/fail", {"error": "x"}, headers={"Idempotency-Key": "fail-1"})
    # Without the key a second report would be an invalid transition; with it, the same answer.
    retried = api.post(f"/runs/{run['id']}/fail", {"error": "x"}, headers={"Idempotency-Key": "fail-1"})
    assert failed.status_code == retried.status_code == 200
    assert retried.json()["recovery_item"]["id"] == failed.json()["recovery_item"]["id"]


@pytest.mark.parametrize("key", ["", "has space", "ü-nicode", "k" * 256])
def test_a_malformed_key_is_422(api, key):
    response = api.post("/runs", RUN, headers={"Idempotency-Key": key})
    # An empty key is a client bug too: silently running without idempotency would hide it.
    assert response.status_code == 422 and error_of(response)["code"] == "invalid_request"
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_request_whose_key_is_still_in_flight_gets_409(api, agent_key, monkeypatch):
    """Another process holds the key's uncommitted record: we wait briefly, then answer 409."""
    monkeypatch.setattr(idempotency, "IN_FLIGHT_WAIT_MS", 300)
    holding, release = threading.Event(), threading.Event()

    def first_request_in_flight() -> None:
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    tenant=agent_key[0].tenant,
                    key="slow",
                    method="POST",
                    path="/api/v1/runs",
                    request_hash="x",
                )
                holding.set()
                release.wait(10)
                transaction.set_rollback(True)
        finally:
            connection.close()

    thread = threading.Thread(target=first_request_in_flight)
    thread.start()
    try:
        assert holding.wait(10)
        response = api.post("/runs", RUN, headers={"Idempotency-Key": "slow"})
        assert response.status_code == 409
        assert error_of(response)["code"] == "idempotency_key_in_flight"
    finally:
        release.set()
        thread.join()
    # The first request rolled back: the key is free again.
    assert api.post("/runs", RUN, headers={"Idempotency-Key": "slow"}).status_code == 201
