from __future__ import annotations

import pytest

from tests.factories import new_action, new_run
from tests.support.api import error_of

pytestmark = pytest.mark.django_db


def test_it_writes_lists_and_returns_the_latest_checkpoint(api, onboarding_policies):
    run = new_run(api)
    action = new_action(api, run["id"])
    assert api.get(f"/runs/{run['id']}/checkpoints/latest").status_code == 404

    first = api.post(
        f"/runs/{run['id']}/checkpoints",
        {
            "name": "user-created",
            "state": {"user_id": 17},
            "completed_action_ids": [action["id"]],
            "recovery_mode": "resume_only",
            "recovery_instructions": "Resume from license provisioning.",
            "summary": "HR account exists.",
            "trace_links": ["https://traces.example.com/t/1"],
        },
    )
    assert first.status_code == 201
    body = first.json()
    assert body["id"].startswith("chk_") and body["completed_action_ids"] == [action["id"]]
    assert body["recovery_mode"] == "resume_only" and body["state"] == {"user_id": 17}
    second = api.post(f"/runs/{run['id']}/checkpoints", {"name": "license-provisioned"}).json()

    listed = api.get(f"/runs/{run['id']}/checkpoints").json()
    assert [c["id"] for c in listed["items"]] == [second["id"], body["id"]] and listed["next_cursor"] is None
    paged = api.get(f"/runs/{run['id']}/checkpoints", {"limit": 1}).json()
    assert [c["id"] for c in paged["items"]] == [second["id"]]
    rest = api.get(f"/runs/{run['id']}/checkpoints", {"limit": 1, "cursor": paged["next_cursor"]}).json()
    assert [c["id"] for c in rest["items"]] == [body["id"]]
    assert api.get(f"/runs/{run['id']}/checkpoints/latest").json()["id"] == second["id"]


def test_it_refuses_action_ids_of_another_run(api, onboarding_policies):
    other = new_run(api)
    foreign = new_action(api, other["id"])
    run = new_run(api)
    response = api.post(
        f"/runs/{run['id']}/checkpoints", {"name": "cp", "pending_action_ids": [foreign["id"]]}
    )
    assert response.status_code == 422
    assert error_of(response)["details"] == {"unknown_action_ids": [foreign["id"]]}


def test_it_refuses_an_unknown_recovery_mode(api):
    run = new_run(api)
    response = api.post(f"/runs/{run['id']}/checkpoints", {"name": "cp", "recovery_mode": "yolo"})
    assert response.status_code == 422
    assert error_of(response)["details"]["errors"][0]["field"] == "recovery_mode"
