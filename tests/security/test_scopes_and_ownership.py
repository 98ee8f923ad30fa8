"""Scopes (agent, operator, approver), self-approval and run ownership.

Personas: agent A is Acme's onboarding agent (``agent_key``), agent B Acme's billing agent (a key of
its own), the supervisor automation holds the operator scope (``operator_key``), the approval bot
the approver scope (``approver_key``). The headline proofs run over real HTTP against the live
server; the sweeps over every operation use the in-process client.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.db import IntegrityError, transaction

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, AgentKey, Checkpoint, Compensator, Event, PolicySet, Run, Tenant, ToolPolicy
from ledger.services import checkpoints
from ledger.services.keys import agent_key_create, agent_key_revoke
from recovery.actions import commands
from recovery.models import AgentCommand, Approval, UnwindStep
from recovery.unwinds.advance import unwind_advance_move
from tests.factories import issue_key
from tests.support.api import Api, error_of
from tests.support.processes import ROOT, database_url_for_subprocesses

pytestmark = pytest.mark.timeout(120)

TESTS = Actor.system("tests")


def delete_user(**_fields: Any) -> dict[str, Any]:
    """The HR system's undo (a Python compensator); these tests never get as far as running it."""
    return {}


@pytest.fixture
def policies(db: Any) -> None:
    """Creating an HR user is routine (low, automatic) and undone by ``hr.delete_user``, which
    itself needs a person; a small refund is low risk but always needs a person."""
    for tool, risk, approval, action_class, compensation in (
        ("hr.create_user", "low", "auto", "internal_update", "custom"),
        ("hr.delete_user", "low", "manual", "internal_update", "none"),
        ("payments.small_refund", "low", "manual", "external_irreversible", "none"),
    ):
        ToolPolicy.objects.create(
            tool=tool, risk=risk, approval=approval, action_class=action_class, compensation=compensation
        )
    Compensator.objects.create(tool="hr.delete_user", kind="python", python_path=f"{__name__}.delete_user")
    PolicySet.objects.create(tenant=None, default_policy={}, auto_compensate={}, unwind={})


def _key(tenant: Tenant, name: str, *scopes: str) -> tuple[AgentKey, str]:
    # An approver key belongs to a person: one of its own (``<name>-owner``), unless told.
    return issue_key(tenant, name, *scopes)


@pytest.fixture
def agent_b_key(tenant: Tenant) -> tuple[AgentKey, str]:
    return _key(tenant, "billing-agent", "agent")


@pytest.fixture
def http(live_server: Any) -> Iterator[Any]:
    """``http(secret)``: an httpx client on the live server's API with that key."""
    opened: list[httpx.Client] = []

    def client(secret: str) -> httpx.Client:
        opened.append(
            httpx.Client(
                base_url=f"{live_server.url}/api/v1",
                headers={"Authorization": f"Bearer {secret}"},
                timeout=30,
            )
        )
        return opened[-1]

    yield client
    for one in opened:
        one.close()


def _created(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code in (200, 201), response.text
    return response.json()


def _refused(response: Any, status: int, code: str) -> dict[str, Any]:
    body = response.json()
    assert (response.status_code, body["error"]["code"]) == (status, code), body
    return body["error"]


def _refund_waiting_for_approval(agent: httpx.Client) -> tuple[str, str, str]:
    """Agent A asks to refund 40 EUR (low risk, but a person must approve): (run, action, approval)."""
    run = _created(agent.post("/runs", json={"agent": "support-agent", "request": "Refund order 7"}))
    action = _created(
        agent.post(
            f"/runs/{run['id']}/actions",
            json={
                "tool": "payments.small_refund",
                "idempotency_key": "refund-order-7",
                "target_type": "order",
                "target_id": "order-7",
                "args": {"amount": 40, "currency": "EUR"},
            },
        )
    )
    assert (action["status"], action["risk"]) == ("awaiting_approval", "low")
    return run["id"], action["id"], action["approval"]["id"]


def _refusals(run_id: str, code: str) -> int:
    return Event.objects.filter(run_id=run_id, kind="decision.refused", data__code=code).count()


# --- Scopes ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_an_operator_key_cannot_approve_and_an_approver_key_can(
    http, policies, agent_key, operator_key, approver_key
):
    """Pass: the operator key gets 403 ``forbidden`` naming the missing ``approver`` scope on the
    inbox and on approve/reject, and so does the agent key; nothing changes. The approver key
    lists the approval and approves it; the action is then approved."""
    agent = http(agent_key[1])
    run_id, action_id, approval_id = _refund_waiting_for_approval(agent)

    for secret in (operator_key[1], agent_key[1]):
        client = http(secret)
        refused = _refused(client.get("/approvals"), 403, "forbidden")
        assert refused["details"] == {"scope": "approver"} and "'approver'" in refused["message"]
        for decision in ("approve", "reject"):
            _refused(
                client.post(f"/approvals/{approval_id}/{decision}", json={"reason": "mine"}), 403, "forbidden"
            )
    assert Approval.objects.get(pk=approval_id).status == Approval.Status.PENDING
    assert Action.objects.get(pk=action_id).status == Action.Status.AWAITING_APPROVAL

    approver = http(approver_key[1])
    assert [item["id"] for item in _created(approver.get("/approvals"))["items"]] == [approval_id]
    decided = _created(approver.post(f"/approvals/{approval_id}/approve", json={"reason": "order checked"}))
    assert decided["status"] == "approved"
    assert _created(agent.get(f"/actions/{action_id}"))["status"] == "approved"
    assert Event.objects.filter(run_id=run_id, kind="approval.approved", actor_label="approval-bot").exists()


@pytest.mark.django_db(transaction=True)
def test_the_recording_agent_cannot_approve_its_own_request_even_at_low_risk(
    http, policies, tenant, agent_key, approver_key
):
    """Pass: an approver key issued under the recording agent's name (the same agent) gets 403
    ``self_approval`` on a low-risk approval; nothing changes and the refusal is an audit event on
    the run. Another approver grants it."""
    agent = http(agent_key[1])
    run_id, action_id, approval_id = _refund_waiting_for_approval(agent)
    same_agent = http(_key(tenant, agent_key[0].name, "approver")[1])

    refused = _refused(
        same_agent.post(f"/approvals/{approval_id}/approve", json={"reason": "looks fine to me"}),
        403,
        "self_approval",
    )
    assert refused["details"]["approval_id"] == approval_id
    assert Approval.objects.get(pk=approval_id).status == Approval.Status.PENDING
    assert Action.objects.get(pk=action_id).status == Action.Status.AWAITING_APPROVAL
    assert _refusals(run_id, "self_approval") == 1

    _created(http(approver_key[1]).post(f"/approvals/{approval_id}/approve", json={"reason": "ok"}))
    assert Action.objects.get(pk=action_id).status == Action.Status.APPROVED


@pytest.mark.django_db(transaction=True)
def test_the_operator_who_decided_a_compensation_cannot_approve_its_step(
    http, policies, tenant, agent_key, approver_key
):
    """Pass: the ops automation (operator + approver scopes) compensates a failed run; the undo
    step waits for a person (``hr.delete_user`` is manual) and the approval names the ops key as
    requester. That key, and a rotated key of the same name, get 403 ``self_approval`` (audited,
    the step still waits); the approval bot grants it and the step is queued."""
    agent = http(agent_key[1])
    run = _created(agent.post("/runs", json={"agent": "onboarding", "request": "Onboard Ashu"}))
    action = _created(
        agent.post(
            f"/runs/{run['id']}/actions",
            json={
                "tool": "hr.create_user",
                "idempotency_key": "create-ashu",
                "target_id": "ashu@acme.example",
                "args": {"email": "ashu@acme.example"},
                "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@acme.example"}},
            },
        )
    )
    _created(agent.post(f"/actions/{action['id']}/start"))
    _created(agent.post(f"/actions/{action['id']}/succeed", json={"result": {"user_id": 7}}))
    item_id = _created(agent.post(f"/runs/{run['id']}/fail", json={"error": "licence pool empty"}))[
        "recovery_item"
    ]["id"]

    ops_key, ops_secret = _key(tenant, "ops-bot", "operator", "approver")
    ops = http(ops_secret)
    unwind = ops.post(f"/recovery/{item_id}/compensate", json={"reason": "undo the half-onboarding"})
    assert unwind.status_code == 202, unwind.text
    unwind_advance_move(unwind_id=unwind.json()["id"])  # the engine's next move, as a job does it
    approval = Approval.objects.get(step__unwind_id=unwind.json()["id"])
    assert (approval.kind, approval.requested_by_key_id) == (Approval.Kind.COMPENSATION, ops_key.pk)

    rotated = http(_key(tenant, "ops-bot", "approver")[1])
    for client in (ops, rotated):
        _refused(
            client.post(f"/approvals/{approval.pk}/approve", json={"reason": "go"}), 403, "self_approval"
        )
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert approval.step is not None and approval.step.status == UnwindStep.Status.AWAITING_APPROVAL
    assert _refusals(run["id"], "self_approval") == 2

    _created(http(approver_key[1]).post(f"/approvals/{approval.pk}/approve", json={"reason": "checked"}))
    assert UnwindStep.objects.get(pk=approval.step_id).status == UnwindStep.Status.QUEUED


@pytest.mark.django_db(transaction=True)
def test_create_agent_key_refuses_agent_with_approver():
    """Pass: the command exits non-zero with a message naming both scopes and why, and creates
    neither the key nor the tenant; the database refuses such a row too (the backstop)."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url_for_subprocesses(),
        "DEBUG": "1",
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
    }
    result = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "create_agent_key",
            "--tenant",
            "initech",
            "--name",
            "self-approving-agent",
            "--scopes",
            "agent,approver",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0, result.stdout
    assert "cannot hold both the 'agent' and the 'approver' scope" in result.stderr, result.stderr
    assert "sk_" not in result.stdout
    assert not Tenant.objects.filter(slug="initech").exists() and not AgentKey.objects.exists()

    tenant = Tenant.objects.create(slug="initech")
    with pytest.raises(IntegrityError), transaction.atomic():
        AgentKey.objects.create(
            tenant=tenant, name="x", prefix="sk_x", key_hash="0" * 64, scopes=["agent", "approver"]
        )


def test_the_key_service_refuses_agent_with_approver_and_a_blank_name(tenant):
    with pytest.raises(errors.ValidationFailed, match="cannot hold both") as refused:
        agent_key_create(tenant=tenant, name="bot", scopes=["approver", "agent"], actor=TESTS)
    assert refused.value.details["conflict"] == ["agent", "approver"]
    with pytest.raises(errors.ValidationFailed, match="needs a name"):
        agent_key_create(tenant=tenant, name="  ", scopes=["agent"], actor=TESTS)
    assert not AgentKey.objects.exists()
    # Operator and approver together are fine: a person's automation that decides and approves.
    assert issue_key(tenant, "ops", "operator", "approver")


# --- Ownership over HTTP ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_agent_b_gets_404_on_agent_a_run_exactly_like_a_missing_one(
    http, policies, tenant, agent_key, agent_b_key
):
    """Pass: on A's run, action, checkpoints, commands, trail, heartbeat, complete, fail, actions,
    action transitions and command ack, agent B gets the very answer an id that does not exist
    gets (404 ``not_found``, same message); A's run is not in B's list; nothing of A's changed
    (status, heartbeat, actions, checkpoints, the command, the audit log)."""
    a, b = http(agent_key[1]), http(agent_b_key[1])
    run = _created(a.post("/runs", json={"agent": "onboarding", "request": "Onboard Ashu"}))
    run_id = run["id"]
    action_id = _created(
        a.post(f"/runs/{run_id}/actions", json={"tool": "hr.create_user", "idempotency_key": "a-1"})
    )["id"]
    _created(a.post(f"/runs/{run_id}/checkpoints", json={"name": "after HR"}))
    command = commands.command_issue(
        run=Run.objects.get(pk=run_id), kind="resume", actor=TESTS, reason="go on"
    )
    before = (
        Run.objects.filter(pk=run_id).values_list("status", "last_heartbeat_at", "action_count").get(),
        Action.objects.get(pk=action_id).status,
        Checkpoint.objects.filter(run_id=run_id).count(),
        Event.objects.filter(run_id=run_id).count(),
    )

    ghost = {"run": "run_" + "0" * 26, "action": "act_" + "0" * 26, "command": "cmd_" + "0" * 26}
    calls = [
        ("get", "/runs/{run}", None),
        ("get", "/runs/{run}/trail", None),
        ("get", "/runs/{run}/commands", None),
        ("get", "/runs/{run}/checkpoints", None),
        ("get", "/runs/{run}/checkpoints/latest", None),
        ("get", "/actions/{action}", None),
        ("post", "/runs/{run}/heartbeat", {}),
        ("post", "/runs/{run}/complete", {}),
        ("post", "/runs/{run}/fail", {"error": "B says A failed"}),
        ("post", "/runs/{run}/checkpoints", {"name": "B's checkpoint"}),
        ("post", "/runs/{run}/actions", {"tool": "hr.create_user", "idempotency_key": "b-1"}),
        ("post", "/actions/{action}/start", None),
        ("post", "/actions/{action}/succeed", {"result": {}}),
        ("post", "/actions/{action}/fail", {"error": "x", "retryable": False, "layer": "tool"}),
        ("post", "/actions/{action}/verify", {"ok": False}),
        ("post", "/actions/{action}/reconcile", {"happened": False, "reason": "B says so"}),
        ("post", "/commands/{command}/ack", None),
    ]
    theirs = {"run": run_id, "action": action_id, "command": command.pk}
    for method, path, body in calls:
        kwargs = {"json": body} if body is not None else {}
        answer = getattr(b, method)(path.format(**theirs), **kwargs)
        missing = getattr(b, method)(path.format(**ghost), **kwargs)
        refused = _refused(answer, 404, "not_found")
        assert refused["message"] == error_of_httpx(missing)["message"].replace(
            ghost[_kind(path)], theirs[_kind(path)]
        ), (path, refused, missing.text)

    assert run_id not in {r["id"] for r in _created(b.get("/runs"))["items"]}
    assert run_id in {r["id"] for r in _created(a.get("/runs"))["items"]}
    after = (
        Run.objects.filter(pk=run_id).values_list("status", "last_heartbeat_at", "action_count").get(),
        Action.objects.get(pk=action_id).status,
        Checkpoint.objects.filter(run_id=run_id).count(),
        Event.objects.filter(run_id=run_id).count(),
    )
    assert after == before
    assert AgentCommand.objects.get(pk=command.pk).status == AgentCommand.Status.PENDING
    # A still reaches all of it.
    assert _created(a.post(f"/runs/{run_id}/heartbeat", json={}))["commands"][0]["id"] == command.pk


def _kind(path: str) -> str:
    return re.findall(r"\{(\w+)\}", path)[0]


def error_of_httpx(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert response.status_code == 404, body
    return body["error"]


@pytest.mark.django_db(transaction=True)
def test_a_rotated_key_keeps_access_and_an_operator_key_reads_every_run(
    http, policies, tenant, agent_key, agent_b_key, operator_key
):
    """Pass: a new key issued under A's name reads and writes A's run; revoking A's first key
    (401) leaves the new one working. The operator key lists and reads A's and B's runs (detail,
    actions, checkpoints, trail) but may not write as an agent (403, it lacks ``agent``); a key
    with both operator and agent scopes reads A's run and gets 404 writing to it."""
    a, b = http(agent_key[1]), http(agent_b_key[1])
    run_a = _created(a.post("/runs", json={"agent": "onboarding", "request": "Onboard Ashu"}))["id"]
    run_b = _created(b.post("/runs", json={"agent": "billing", "request": "Invoice Hooli"}))["id"]
    action_a = _created(
        a.post(f"/runs/{run_a}/actions", json={"tool": "hr.create_user", "idempotency_key": "a-1"})
    )

    a2 = http(_key(tenant, agent_key[0].name, "agent")[1])
    assert _created(a2.get(f"/runs/{run_a}"))["actions"][0]["id"] == action_a["id"]
    _created(a2.post(f"/runs/{run_a}/actions", json={"tool": "hr.create_user", "idempotency_key": "a-2"}))
    agent_key_revoke(key=agent_key[0], actor=TESTS)
    _refused(a.get(f"/runs/{run_a}"), 401, "unauthorized")
    _created(a2.post(f"/runs/{run_a}/heartbeat", json={}))
    assert Run.objects.get(pk=run_a).action_count == 2

    operator = http(operator_key[1])
    assert {run_a, run_b} <= {r["id"] for r in _created(operator.get("/runs"))["items"]}
    for run_id in (run_a, run_b):
        assert _created(operator.get(f"/runs/{run_id}"))["id"] == run_id
        _created(operator.get(f"/runs/{run_id}/checkpoints"))
        _created(operator.get(f"/runs/{run_id}/trail"))
    assert _created(operator.get(f"/actions/{action_a['id']}"))["id"] == action_a["id"]
    refused = _refused(operator.post(f"/runs/{run_a}/heartbeat", json={}), 403, "forbidden")
    assert refused["details"] == {"scope": "agent"}
    _refused(operator.post("/runs", json={"agent": "x", "request": "y"}), 403, "forbidden")

    ops_agent = http(_key(tenant, "ops-agent", "operator", "agent")[1])
    assert _created(ops_agent.get(f"/runs/{run_a}"))["id"] == run_a
    _refused(ops_agent.post(f"/runs/{run_a}/complete", json={}), 404, "not_found")
    _refused(
        ops_agent.post(f"/runs/{run_a}/actions", json={"tool": "hr.create_user", "idempotency_key": "o-1"}),
        404,
        "not_found",
    )
    assert Run.objects.get(pk=run_a).status == Run.Status.RUNNING


# --- Sweeps over every operation (in-process client) ----------------------------------------------------


def _agent_operations() -> list[tuple[str, str]]:
    from saga_admin.api.app import api

    document = api.get_openapi_schema()
    return [
        (method, path.removeprefix("/api/v1"))
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
        if "agents" in operation.get("tags", [])
    ]


@pytest.fixture
def a_world(policies, tenant, agent):
    """One of each of agent A's objects: a run with an action, a checkpoint and a pending command."""
    from tests.factories import make_run, record

    run = make_run(tenant, agent)
    action = record(run, agent, "a-1")
    checkpoints.checkpoint_write(run=run, actor=agent, name="cp")
    command = commands.command_issue(run=run, kind="resume", actor=TESTS, reason="go")
    return {"run_id": run.pk, "action_id": action.pk, "command_id": command.pk}


@pytest.mark.django_db
def test_every_agent_operation_on_another_agents_object_answers_like_a_missing_one(a_world, agent_b_key):
    """Pass: for every operation of the agent API (enumerated from the OpenAPI document, so a new
    one cannot escape) that names one of A's objects, B's answer has the status and code a
    nonexistent id gets, and a GET is a 404."""
    b = Api(agent_b_key[1])
    ghost = {name: f"{value[:4]}{'0' * 26}" for name, value in a_world.items()}
    checked = 0
    for method, path in _agent_operations():
        if "{" not in path:
            continue

        def call(world: dict[str, str], method: str = method, path: str = path) -> Any:
            url = re.sub(r"\{(\w+)\}", lambda m: world[m.group(1)], path)
            return b.get(url) if method == "get" else b.post(url, {})

        mine, missing = call(a_world), call(ghost)
        assert (mine.status_code, error_of(mine)["code"]) == (
            missing.status_code,
            error_of(missing)["code"],
        ), (method, path, mine.content[:200])
        assert mine.status_code in (404, 422), (method, path)
        assert method != "get" or mine.status_code == 404, path
        checked += 1
    assert checked >= 15


@pytest.mark.django_db
def test_an_operator_only_key_reads_every_agent_operation_and_writes_none(a_world, operator_key):
    """Pass: every GET of the agent API answers the operator key 200 (or the latest checkpoint's
    404 when there is none, which is not the case here); every POST is 403 naming ``agent``."""
    operator = Api(operator_key[1])
    for method, path in _agent_operations():
        url = re.sub(r"\{(\w+)\}", lambda m: a_world[m.group(1)], path)
        if method == "get":
            assert operator.get(url).status_code == 200, path
        else:
            refused = error_of(operator.post(url, {}))
            assert (refused["code"], refused["details"]) == ("forbidden", {"scope": "agent"}), path


@pytest.mark.django_db
def test_an_approver_key_reaches_no_agent_and_no_recovery_operation(a_world, approver_key):
    approver = Api(approver_key[1])
    assert error_of(approver.get(f"/runs/{a_world['run_id']}"))["code"] == "forbidden"
    assert approver.post("/runs", {"agent": "x", "request": "y"}).status_code == 403
    assert approver.get("/recovery").status_code == 403


@pytest.mark.django_db
def test_another_agent_reusing_an_idempotency_key_never_gets_the_first_agents_answer(
    policies, tenant, agent_key, agent_b_key
):
    """Pass: B sending A's Idempotency-Key with A's exact run body gets 422 (not A's new run); B
    recording an action with A's action key on A's run gets 404 (not A's action)."""
    a, b = Api(agent_key[1]), Api(agent_b_key[1])
    body = {"agent": "onboarding", "request": "Onboard Ashu"}
    run = a.post("/runs", body, headers={"Idempotency-Key": "onboard-ashu"}).json()
    reused = b.post("/runs", body, headers={"Idempotency-Key": "onboard-ashu"})
    assert error_of(reused)["code"] == "idempotency_key_reused"
    assert run["id"] not in reused.content.decode()

    action = {"tool": "hr.create_user", "idempotency_key": "create-ashu"}
    assert a.post(f"/runs/{run['id']}/actions", action).status_code == 201
    replay = b.post(f"/runs/{run['id']}/actions", action)
    assert (replay.status_code, error_of(replay)["code"]) == (404, "not_found")
    assert Action.objects.filter(run_id=run["id"]).count() == 1


@pytest.mark.django_db
def test_a_new_run_belongs_to_the_creating_keys_agent(agent_key):
    run = Api(agent_key[1]).post("/runs", {"agent": "declared-name", "request": "x"}).json()
    assert Run.objects.get(pk=run["id"]).owner == "onboarding-agent"
