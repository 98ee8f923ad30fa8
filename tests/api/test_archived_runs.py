"""A run retention archived (tests/support/archived.py leaves exactly what the archiver does):
every operation under /runs/{run_id} answers 410 ``archived`` with where the archive is, to a key
that could have read the run, and changes nothing; any other key gets the 404 of a run that never
existed. Through the real URL stack, as an attacker would try it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ledger.models import ArchivedRun, Event, IdempotencyRecord, Run
from tests.factories import issue_key, make_run, record
from tests.support.api import Api, error_of
from tests.support.archived import archive_run_for_test

pytestmark = pytest.mark.django_db

ARCHIVE = "s3://saga-archive/acme/2026/11/run.manifest.json"
SPEC = Path(__file__).resolve().parents[2] / "clients" / "spec" / "openapi.json"

# A body each write would accept for a live run of its caller: the refusal must come from the
# archive, not from the body.
BODIES: dict[str, Any] = {
    "actions": {"tool": "hr.create_user", "idempotency_key": "late-1", "args": {"email": "a@b.c"}},
    "cancel": {"reason": "stop it"},
    "checkpoints": {"name": "late"},
    "complete": {"summary": "done"},
    "fail": {"error": "boom"},
    "flag": {"reason": "look at it"},
    "heartbeat": {"note": "alive"},
    "plan": {"actions": [{"tool": "hr.create_user", "idempotency_key": "plan-1", "args": {}}]},
}


def run_operations() -> list[tuple[str, str, list[str]]]:
    """(method, path under /api/v1, tags) of every operation on one run, from the OpenAPI document."""
    document = json.loads(SPEC.read_text())
    return [
        (method, path.removeprefix("/api/v1"), operation.get("tags", []))
        for path, methods in document["paths"].items()
        if "{run_id}" in path
        for method, operation in methods.items()
    ]


def call(api: Api, method: str, path: str, run_id: str):
    url = path.replace("{run_id}", run_id)
    if method == "get":
        return api.get(url)
    return api.post(url, BODIES[url.rsplit("/", 1)[-1]])


@pytest.fixture
def archived(tenant, agent):
    run = make_run(tenant, agent)
    record(run, agent, "k1")
    return archive_run_for_test(run, ARCHIVE)


def test_the_sweep_covers_every_run_operation():
    operations = run_operations()
    assert len(operations) >= 14
    assert {path.rsplit("/", 1)[-1] for method, path, _tags in operations if method == "post"} == set(BODIES)


def test_the_runs_agent_and_an_operator_get_410_with_the_archive_on_every_run_operation(
    archived, tenant, agent_key, operator_key
):
    """Pass: GET and every write under /runs/{run_id} answer 410 ``archived`` with ``details``
    ``{archive, archived_at}``: to the run's own agent, to an operator key (it reads every run of
    its tenant), and to a key of another agent with both scopes for the writes as well (reading
    decides: the run takes no write from anyone); nothing is written."""
    agent, operator = Api(agent_key[1]), Api(operator_key[1])
    both = Api(issue_key(tenant, "supervisor-agent", "agent", "operator")[1])
    before = (Event.objects.count(), IdempotencyRecord.objects.count(), Run.objects.count())
    checked = 0
    for method, path, tags in run_operations():
        writers = [operator, both] if "recovery" in tags else [agent, both]
        callers = [agent, operator, both] if method == "get" else writers
        for caller in callers:
            response = call(caller, method, path, archived.run_id)
            assert response.status_code == 410, (method, path, response.content[:300])
            error = error_of(response)
            assert error["code"] == "archived"
            assert error["details"] == {"archive": ARCHIVE, "archived_at": archived.archived_at.isoformat()}
            assert archived.run_id in error["message"] and ARCHIVE in error["message"]
            checked += 1
    assert checked >= 30
    assert (Event.objects.count(), IdempotencyRecord.objects.count(), Run.objects.count()) == before
    assert not Run.objects.filter(pk=archived.run_id).exists()


def test_a_write_with_an_idempotency_key_is_refused_and_stores_nothing(archived, agent_key):
    agent = Api(agent_key[1])
    for _ in range(2):
        response = agent.post(
            f"/runs/{archived.run_id}/complete", {"summary": "x"}, headers={"Idempotency-Key": "k-archived"}
        )
        assert response.status_code == 410 and error_of(response)["code"] == "archived"
    assert not IdempotencyRecord.objects.filter(key="k-archived").exists()


def test_another_tenant_and_another_agent_get_the_404_of_a_run_that_never_was(
    archived, tenant, outsider_key, other_tenant
):
    """Pass: Globex's key (agent + operator scopes) and an agent-only key of another Acme agent get,
    on every run operation, exactly what an id that never existed gets: the archive does not leak."""
    other_agent = Api(issue_key(tenant, "another-agent")[1])
    outsider = Api(outsider_key[1])
    ghost = f"{archived.run_id[:4]}{'0' * 26}"
    checked = 0
    for method, path, tags in run_operations():
        callers = [outsider] if "recovery" in tags else [outsider, other_agent]
        for caller in callers:
            response, never = call(caller, method, path, archived.run_id), call(caller, method, path, ghost)
            assert response.status_code == never.status_code == 404, (method, path, response.content[:300])
            error = error_of(response)
            assert error["code"] == "not_found"
            assert error["message"] == error_of(never)["message"].replace(ghost, archived.run_id)
            assert ARCHIVE not in response.content.decode()
            checked += 1
    assert checked >= 26


def test_an_agent_keys_reach_follows_the_runs_owner(archived, tenant):
    """Pass: a rotated key of the run's agent (same name) reaches the archived run as it reached
    the live one: 410."""
    rotated = Api(issue_key(tenant, "onboarding-agent")[1])
    response = rotated.get(f"/runs/{archived.run_id}")
    assert response.status_code == 410 and error_of(response)["details"]["archive"] == ARCHIVE


def test_a_live_run_and_a_malformed_id_are_unchanged(archived, tenant, agent, agent_key):
    api = Api(agent_key[1])
    live = make_run(tenant, agent)
    assert api.get(f"/runs/{live.pk}").status_code == 200
    response = api.get("/runs/not-an-id")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"


def test_an_action_of_an_archived_run_is_not_found(tenant, agent, agent_key):
    """Pass: only runs are tombstoned; an action (looked up by its own id) of an archived run is the
    404 of an unknown action, for reading and for reporting on it."""
    api = Api(agent_key[1])
    run = make_run(tenant, agent)
    action = record(run, agent, "k-gone")
    archive_run_for_test(run, ARCHIVE)
    assert ArchivedRun.objects.filter(pk=run.pk).exists()
    for response in (
        api.get(f"/actions/{action.pk}"),
        api.post(f"/actions/{action.pk}/start", {}),
    ):
        assert response.status_code == 404 and error_of(response)["code"] == "not_found", response.content
