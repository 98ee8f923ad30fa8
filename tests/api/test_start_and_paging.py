"""``start: true`` on record (one call instead of two), and bounded run reads
(the run's detail shows its newest 100 actions and ``actions_next``; ``/runs/{id}/actions`` pages
them all, oldest first)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.audit import Actor, audit_verify
from ledger.models import Action, AgentKey, Event, Run
from ledger.services.actions import recording
from ledger.services.keys import key_cache_clear
from recovery.actions.approvals import action_record_gated
from recovery.actions.resolutions import item_close
from recovery.models import Approval, RecoveryItem
from tests.factories import new_action, new_run
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db

BODY = {
    "tool": "hr.create_user",
    "target_type": "user",
    "target_id": "ashu@company.com",
    "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
    "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
}


@pytest.fixture
def run(api, onboarding_policies):
    return new_run(api)


@pytest.fixture
def operator(operator_key) -> Api:
    return Api(operator_key[1])


def _record(api: Api, run_id: str, key: str, **fields):
    return api.post(f"/runs/{run_id}/actions", {**BODY, "idempotency_key": key, **fields})


def _kinds(action_id: str) -> list[str]:
    return list(Event.objects.filter(subject_id=action_id).order_by("id").values_list("kind", flat=True))


# --- start: true --------------------------------------------------------------------------------


def test_start_true_returns_a_running_action_at_attempt_1_audited_as_started(api, run):
    response = _record(api, run["id"], "k-1", start=True)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["attempts"]) == ("running", 1)
    assert body["started_at"] is not None
    row = Action.objects.get(pk=body["id"])
    assert (row.status, row.attempts, row.started_at is not None) == ("running", 1, True)
    assert _kinds(body["id"]) == ["action.recorded", "action.started"]
    started = Event.objects.get(subject_id=body["id"], kind="action.started")
    assert (started.from_state, started.to_state, started.data["attempt"]) == ("planned", "running", 1)
    assert audit_verify()[1] is None
    # The step goes on as after /start: succeed it.
    done = api.post(f"/actions/{body['id']}/succeed", {"result": {"user_id": "u-1"}})
    assert (done.status_code, done.json()["status"]) == (200, "succeeded")


def test_start_false_or_absent_records_a_planned_action(api, run):
    assert _record(api, run["id"], "k-1").json()["status"] == "planned"
    body = _record(api, run["id"], "k-2", start=False).json()
    assert (body["status"], body["attempts"]) == ("planned", 0)
    assert _kinds(body["id"]) == ["action.recorded"]


def test_start_must_be_a_boolean(api, run):
    response = _record(api, run["id"], "k-1", start="yes")
    assert response.status_code == 422
    assert not Action.objects.exists()


def test_start_true_on_a_gated_action_awaits_approval_and_does_not_start(api, run):
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.refund", "args": {"amount": 10}, "idempotency_key": "refund", "start": True},
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["status"], body["attempts"], body["started_at"]) == ("awaiting_approval", 0, None)
    assert body["approval"]["status"] == "pending"
    assert Approval.objects.filter(action_id=body["id"], status="pending").count() == 1
    assert "action.started" not in _kinds(body["id"])
    assert Action.objects.get(pk=body["id"]).attempts == 0


def test_a_replay_returns_the_action_as_it_is_now_and_starts_nothing(api, run):
    # Recorded without start, replayed with it: still planned (start is not in the fingerprint).
    planned = _record(api, run["id"], "plain").json()
    replay = _record(api, run["id"], "plain", start=True)
    assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
    assert (replay.json()["id"], replay.json()["status"], replay.json()["attempts"]) == (
        planned["id"],
        "planned",
        0,
    )
    assert _kinds(planned["id"]) == ["action.recorded"]

    # Recorded with start, replayed (with or without it): running, attempt 1, started once.
    started = _record(api, run["id"], "quick", start=True, target_id="b@company.com").json()
    for again in ({"start": True}, {}):
        replay = _record(api, run["id"], "quick", target_id="b@company.com", **again)
        assert replay.status_code == 200, replay.content
        assert (replay.json()["id"], replay.json()["status"], replay.json()["attempts"]) == (
            started["id"],
            "running",
            1,
        )
    assert _kinds(started["id"]) == ["action.recorded", "action.started"]

    # Once it succeeded, the replay carries its result.
    api.post(f"/actions/{started['id']}/succeed", {"result": {"ok": True}})
    replay = _record(api, run["id"], "quick", start=True, target_id="b@company.com").json()
    assert (replay["status"], replay["result"]) == ("succeeded", {"ok": True})
    # Another payload under the same key is still refused.
    reused = _record(api, run["id"], "quick", start=True, target_id="c@company.com")
    assert (reused.status_code, error_of(reused)["code"]) == (422, "idempotency_key_reused")


@pytest.mark.parametrize("pause", [{"tool": "hr.*"}, {"agent": "onboarding-agent"}])
def test_start_true_under_a_pause_is_refused_and_records_nothing(api, run, operator, pause):
    paused = operator.post("/pauses", {**pause, "reason": "INC-42"})
    assert paused.status_code == 201, paused.content
    response = _record(api, run["id"], "k-1", start=True)
    assert (response.status_code, error_of(response)["code"]) == (409, "paused")
    assert not Action.objects.exists()
    assert not Event.objects.filter(kind="action.started").exists()
    assert Event.objects.filter(run_id=run["id"], kind="action.refused").count() == 1


def test_start_true_on_a_failed_or_closed_run_is_refused(api, run):
    failed = api.post(f"/runs/{run['id']}/fail", {"error": "boom"})
    assert failed.status_code == 200, failed.content
    response = _record(api, run["id"], "k-1", start=True)
    assert response.status_code == 409
    assert error_of(response)["details"]["current"] == "failed"

    item = RecoveryItem.objects.get(run_id=run["id"])
    item_close(item=item, actor=Actor.system("tests"), reason="nothing to undo")
    assert Run.objects.get(pk=run["id"]).status == "closed"
    response = _record(api, run["id"], "k-2", start=True)
    assert (response.status_code, error_of(response)["code"]) == (409, "run_not_accepting_actions")
    assert error_of(response)["details"]["current"] == "closed"
    assert not Action.objects.exists()


def test_the_ledger_service_takes_start_and_the_gated_service_passes_it_through(
    agent_key, onboarding_policies, api
):
    run = Run.objects.get(pk=new_run(api)["id"])
    actor = Actor.for_key(agent_key[0])
    plain = recording.action_record(run=run, actor=actor, tool="hr.create_user", idempotency_key="a")
    started = recording.action_record(
        run=run, actor=actor, tool="hr.create_user", idempotency_key="b", start=True
    )
    # The ledger leaves a gated action planned (its gate is the recovery layer's).
    gated_in_ledger = recording.action_record(
        run=run, actor=actor, tool="payments.refund", idempotency_key="c", start=True
    )
    gated = action_record_gated(run=run, actor=actor, tool="payments.refund", idempotency_key="d", start=True)
    assert [r.action.status for r in (plain, started, gated_in_ledger, gated)] == [
        "planned",
        "running",
        "planned",
        "awaiting_approval",
    ]
    assert started.action.attempts == 1 and gated.action.attempts == 0


# --- Bounded reads ------------------------------------------------------------------------------


def _bulk(run_id: str, agent_key, count: int, *, start_at: int = 0) -> list[str]:
    run = Run.objects.get(pk=run_id)
    actor = Actor.for_key(agent_key[0])
    ids = []
    for i in range(start_at, start_at + count):
        recorded = action_record_gated(
            run=run,
            actor=actor,
            # Every tenth needs approval, so approvals are part of what is read.
            tool="payments.refund" if i % 10 == 0 else "hr.create_user",
            idempotency_key=f"{run_id}:bulk-{i}",
            target_id=f"u{i}@company.com",
        )
        ids.append(recorded.action.pk)
    return ids


def test_a_short_run_shows_every_action_and_no_next_page(api, run):
    ids = [new_action(api, run["id"], key=f"k-{i}", target_id=f"u{i}")["id"] for i in range(3)]
    body = api.get(f"/runs/{run['id']}").json()
    assert [a["id"] for a in body["actions"]] == ids
    assert body["actions_next"] is None
    page = api.get(f"/runs/{run['id']}/actions").json()
    assert ([a["id"] for a in page["items"]], page["next_cursor"]) == (ids, None)


@pytest.mark.slow
def test_a_long_run_shows_its_newest_100_and_the_pages_yield_every_action_once(api, run, agent_key):
    ids = _bulk(run["id"], agent_key, 250)
    body = api.get(f"/runs/{run['id']}").json()
    assert [a["id"] for a in body["actions"]] == ids[-100:]
    assert [a["seq"] for a in body["actions"]] == list(range(151, 251))
    # Gated actions among those shown carry their approval.
    assert body["actions"][-10]["approval"]["status"] == "pending"
    assert body["actions_next"] == f"/api/v1/runs/{run['id']}/actions"

    seen: list[str] = []
    path, params = body["actions_next"].removeprefix("/api/v1"), {"limit": 70}
    pages = 0
    while True:
        response = api.get(path, params)
        assert response.status_code == 200, response.content
        page = response.json()
        assert len(page["items"]) <= 70
        seen += [a["id"] for a in page["items"]]
        pages += 1
        if page["next_cursor"] is None:
            break
        params = {"limit": 70, "cursor": page["next_cursor"]}
    assert seen == ids and len(set(seen)) == 250 and pages == 4


def test_actions_added_while_paging_come_at_the_end(api, run, agent_key):
    first = _bulk(run["id"], agent_key, 5)
    page = api.get(f"/runs/{run['id']}/actions", {"limit": 3}).json()
    later = _bulk(run["id"], agent_key, 2, start_at=5)
    rest = api.get(f"/runs/{run['id']}/actions", {"limit": 500, "cursor": page["next_cursor"]}).json()
    assert [a["id"] for a in page["items"] + rest["items"]] == first + later
    assert rest["next_cursor"] is None


def test_run_warnings_cover_the_whole_run_not_only_the_actions_shown(api, run, agent_key):
    # An irreversible e-mail first, then 120 reversible steps: every one after the pivot warns,
    # those older than the newest 100 included.
    new_action(api, run["id"], key="mail", tool="email.send_welcome", compensation=None)
    reversible = [new_action(api, run["id"], key=f"r-{i}", target_id=f"u{i}")["id"] for i in range(120)]
    body = api.get(f"/runs/{run['id']}").json()
    assert len(body["actions"]) == 100
    warned = [w["action_id"] for w in body["warnings"] if w["code"] == "pivot_order"]
    assert warned == reversible


@pytest.mark.parametrize("limit", [0, 501, "lots"])
def test_a_limit_out_of_range_is_refused(api, run, limit):
    response = api.get(f"/runs/{run['id']}/actions", {"limit": limit})
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_request"


def test_500_is_the_largest_page(api, run, agent_key):
    _bulk(run["id"], agent_key, 3)
    assert api.get(f"/runs/{run['id']}/actions", {"limit": 500}).status_code == 200


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor",
        "WzEsMl0",  # [1,2]: a list, but not a (seq, action id)
        "WyIxIiwiYWN0X3giXQ",  # ["1","act_x"]: seq must be an integer
        "W10",  # []
        "x" * 300,
    ],
)
def test_a_forged_cursor_is_refused(api, run, agent_key, cursor):
    _bulk(run["id"], agent_key, 3)
    response = api.get(f"/runs/{run['id']}/actions", {"cursor": cursor})
    assert response.status_code == 422, response.content
    assert error_of(response)["code"] == "invalid_request"


def test_another_agents_or_tenants_run_is_not_found(db, api, run, agent_key, outsider_key, tenant):
    from ledger.services.keys import agent_key_create

    _bulk(run["id"], agent_key, 2)
    other_agent = agent_key_create(
        tenant=tenant, name="billing-agent", scopes=["agent"], actor=Actor.system("tests")
    )
    for key in (other_agent.secret, outsider_key[1]):
        response = Api(key).get(f"/runs/{run['id']}/actions")
        assert (response.status_code, error_of(response)["code"]) == (404, "not_found")
    assert Api(None).get(f"/runs/{run['id']}/actions").status_code == 401


def test_an_operator_key_reads_any_runs_actions(api, run, agent_key, operator):
    ids = _bulk(run["id"], agent_key, 2)
    page = operator.get(f"/runs/{run['id']}/actions").json()
    assert [a["id"] for a in page["items"]] == ids


@pytest.mark.slow
def test_the_run_detail_reads_a_constant_number_of_queries(api, agent_key, onboarding_policies):
    short, long_ = new_run(api), new_run(api, external_id="long")
    _bulk(short["id"], agent_key, 3)
    _bulk(long_["id"], agent_key, 250)

    def queries_of(path: str, params: dict | None = None) -> int:
        # Neither the key's lookup nor its last_used_at are part of what the request reads: the
        # lookup is served from this process's cache for 5 s (a loaded machine can take longer
        # between two requests), and last_used_at is refreshed by the first request a minute
        # after the last refresh. Each counted request starts with both in the same state.
        key_cache_clear()
        AgentKey.objects.update(last_used_at=timezone.now())
        with CaptureQueriesContext(connection) as queries:
            response = api.get(path, params)
        assert response.status_code == 200
        return len(queries)

    counts = [queries_of(f"/runs/{run['id']}") for run in (short, long_)]
    assert counts[0] == counts[1], counts
    paged = queries_of(f"/runs/{long_['id']}/actions", {"limit": 500})
    assert queries_of(f"/runs/{short['id']}/actions", {"limit": 500}) == paged


def test_the_openapi_documents_the_new_fields(db, api):
    spec = api.client.get("/api/v1/openapi.json").json()
    assert "/api/v1/runs/{run_id}/actions" in spec["paths"]
    assert "get" in spec["paths"]["/api/v1/runs/{run_id}/actions"]
    schemas = spec["components"]["schemas"]
    assert "start" in schemas["ActionIn"]["properties"]
    assert "actions_next" in schemas["RunDetailOut"]["properties"]
