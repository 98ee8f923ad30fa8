"""Pauses through the whole URL stack: the operator's /pauses endpoints (scope, strict bodies,
tenant isolation, lists, lift) and the agent's 409 ``paused`` on run create and action record."""

from __future__ import annotations

import pytest

from ledger.models import Action, Event, Pause, Run
from tests.factories import new_action, new_run
from tests.support.api import Api, error_of


@pytest.fixture
def operator(operator_key) -> Api:
    return Api(operator_key[1])


@pytest.fixture
def outsider(outsider_key) -> Api:
    return Api(outsider_key[1])


def _pause(operator: Api, **body) -> dict:
    body.setdefault("reason", "refund bug, INC-42")
    response = operator.post("/pauses", body)
    assert response.status_code == 201, response.content
    return response.json()


# --- The operator's endpoints -----------------------------------------------------------------


def test_it_pauses_with_the_operator_scope_only(db, operator, api, outsider):
    assert Api(None).post("/pauses", {"tool": "payments.*", "reason": "x"}).status_code == 401
    refused = api.post("/pauses", {"tool": "payments.*", "reason": "x"})  # the agent's key
    assert (refused.status_code, error_of(refused)["code"]) == (403, "forbidden")
    assert not Pause.objects.exists()
    body = _pause(operator, tool="payments.*")
    assert body["id"].startswith("pau_")
    assert {k: body[k] for k in ("agent", "tool", "status", "reason", "created_by", "lifted_by")} == {
        "agent": "",
        "tool": "payments.*",
        "status": "active",
        "reason": "refund bug, INC-42",
        "created_by": "supervisor",
        "lifted_by": None,
    }
    event = Event.objects.get(kind="pause.created")
    assert (event.subject_id, event.actor_label, event.reason) == (
        body["id"],
        "supervisor",
        "refund bug, INC-42",
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reason": "nothing named"}, "agent"),
        ({"agent": "", "tool": "  ", "reason": "blank"}, "agent"),
        ({"tool": "payments.*"}, "reason"),
        ({"tool": "payments.*", "reason": ""}, "reason"),
        ({"tool": "payments.*", "reason": "x", "scope": "all"}, "scope"),
        ({"tool": 7, "reason": "x"}, "tool"),
        ({"tool": "x" * 201, "reason": "x"}, "tool"),
    ],
)
def test_it_refuses_a_bad_pause_with_422(db, operator, body, field):
    response = operator.post("/pauses", body)
    assert response.status_code == 422, response.content
    assert field in str(error_of(response))
    assert not Pause.objects.exists()


def test_it_lists_active_by_default_then_lifted_and_all(db, operator, outsider):
    first = _pause(operator, tool="a.*")
    second = _pause(operator, agent="billing")
    _pause(outsider, tool="c.*")
    assert operator.post(f"/pauses/{first['id']}/lift", {"reason": "fixed"}).status_code == 200

    def ids(**params) -> list[str]:
        response = operator.get("/pauses", params)
        assert response.status_code == 200, response.content
        return [p["id"] for p in response.json()["items"]]

    assert ids() == [second["id"]]
    assert ids(status="lifted") == [first["id"]]
    assert ids(status="all") == [second["id"], first["id"]]
    page = operator.get("/pauses", {"status": "all", "limit": 1}).json()
    assert [p["id"] for p in page["items"]] == [second["id"]]
    rest = operator.get("/pauses", {"status": "all", "limit": 1, "cursor": page["next_cursor"]}).json()
    assert ([p["id"] for p in rest["items"]], rest["next_cursor"]) == ([first["id"]], None)
    for params in ({"status": "paused"}, {"cursor": "not-ours"}, {"limit": 0}):
        assert operator.get("/pauses", params).status_code == 422


def test_it_lifts_once_and_answers_409_to_the_second_lift(db, operator):
    pause = _pause(operator, agent="onboarding")
    lifted = operator.post(f"/pauses/{pause['id']}/lift", {"reason": "fixed in v2.3"})
    assert lifted.status_code == 200
    body = lifted.json()
    assert (body["status"], body["lifted_by"], body["lift_reason"]) == (
        "lifted",
        "supervisor",
        "fixed in v2.3",
    )
    assert body["lifted_at"]
    again = operator.post(f"/pauses/{pause['id']}/lift", {"reason": "me too"})
    assert (again.status_code, error_of(again)["code"]) == (409, "invalid_transition")
    assert Pause.objects.get(pk=pause["id"]).lift_reason == "fixed in v2.3"
    assert Event.objects.filter(kind="pause.lifted").count() == 1
    assert operator.post(f"/pauses/{pause['id']}/lift", {}).status_code == 422


def test_another_tenants_pause_is_not_found(db, operator, outsider):
    theirs = _pause(outsider, tool="payments.*")
    for pause_id in (theirs["id"], "pau_00000000000000000000000000", "not-an-id"):
        response = operator.post(f"/pauses/{pause_id}/lift", {"reason": "mine now"})
        assert (response.status_code, error_of(response)["code"]) == (404, "not_found")
    assert Pause.objects.get(pk=theirs["id"]).is_active


# --- What the agent gets ----------------------------------------------------------------------


@pytest.mark.parametrize("idempotency_key", [None, "start-1"])
def test_a_paused_agent_gets_409_paused_on_run_create_audited_once(db, api, operator, idempotency_key):
    pause = _pause(operator, agent="onboarding-agent")  # the key's name
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    response = api.post("/runs", {"agent": "onboarding", "request": "Onboard Ashu"}, headers=headers)
    assert response.status_code == 409, response.content
    error = error_of(response)
    assert error["code"] == "paused"
    assert error["details"] == {"pause_id": pause["id"], "agent": "onboarding-agent", "tool": ""}
    assert pause["id"] in error["message"] and "refund bug, INC-42" in error["message"]
    assert not Run.objects.exists()
    [event] = Event.objects.filter(kind="run.refused")
    assert (event.run_id, event.subject_id, event.actor_label) == (None, pause["id"], "onboarding-agent")
    # After the lift, the same request (and key) starts the run.
    assert operator.post(f"/pauses/{pause['id']}/lift", {"reason": "fixed"}).status_code == 200
    retried = api.post("/runs", {"agent": "onboarding", "request": "Onboard Ashu"}, headers=headers)
    assert retried.status_code == 201, retried.content


def test_a_paused_tool_gets_409_paused_on_action_record_and_nothing_is_recorded(
    onboarding_policies, api, operator
):
    run = new_run(api)
    new_action(api, run["id"], key="k-1")
    pause = _pause(operator, tool="hr.*")
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "hr.create_user", "args": {"email": "b@company.com"}, "idempotency_key": "k-2"},
    )
    assert response.status_code == 409, response.content
    assert error_of(response)["details"] == {"pause_id": pause["id"], "agent": "", "tool": "hr.*"}
    assert list(Action.objects.values_list("idempotency_key", flat=True)) == ["k-1"]
    refused = Event.objects.get(run_id=run["id"], kind="action.refused")
    assert refused.data["code"] == "paused"
    # What was recorded before the pause stands: the replay of k-1 is still answered.
    replay = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "hr.create_user",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
            "idempotency_key": "k-1",
            "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        },
    )
    assert replay.status_code == 200, replay.content
    assert operator.post(f"/pauses/{pause['id']}/lift", {"reason": "fixed"}).status_code == 200
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "hr.create_user", "args": {"email": "b@company.com"}, "idempotency_key": "k-2"},
    )
    assert response.status_code == 201, response.content


def test_the_openapi_documents_409_on_run_create_and_action_record(db, api):
    spec = api.client.get("/api/v1/openapi.json").json()
    for path in ("/api/v1/runs", "/api/v1/runs/{run_id}/actions"):
        operation = spec["paths"][path]["post"]
        assert "409" in operation["responses"]
        assert "paused" in operation["description"]
    assert {"/api/v1/pauses", "/api/v1/pauses/{pause_id}/lift"} <= set(spec["paths"])
