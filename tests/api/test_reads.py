"""The agent's reads are one statement each (``saga_admin.api.reads``) and answer
exactly what the ORM's reads answered, byte for byte; their cost does not grow with the run."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from infra.pagination import NEWEST_FIRST, keyset_page
from ledger import selectors as ledger_selectors
from ledger.models import AgentKey, Checkpoint, Run
from ledger.scoping import Reach
from recovery import selectors as recovery_selectors
from saga_admin.api.renderers import render_json
from saga_admin.api.schemas.actions import ActionPageOut, actions_shown, approvals_shown
from saga_admin.api.schemas.checkpoints import CheckpointOut, CheckpointPageOut
from saga_admin.api.schemas.queue import RecoveryItemOut
from saga_admin.api.schemas.runs import RunDetailOut, RunOut
from tests.api.test_round_trips import round_trips
from tests.factories import charge_policy, load_policy_file, new_action, new_run
from tests.support.api import Api, error_of

TWO_FOR_BIG = [{"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approvers": 2}}]


def _as_served(schema: Any, body: dict[str, Any]) -> bytes:
    """What ninja makes of a view's return value: its response schema's one pass, then the renderer."""
    return render_json(schema.model_validate(body).model_dump())


def _shown(actions: list[Any], run_id: str) -> list[Any]:
    return actions_shown(actions, approvals_shown(run_id, actions))


def _orm_run_detail(key: AgentKey, run_id: str) -> bytes:
    """GET /runs/{id} as the ORM's five reads answered it before (the reference)."""
    run = ledger_selectors.run_get(reach=Reach.of_key(key), run_id=run_id)
    newest, more = ledger_selectors.run_actions_newest(run=run)
    checkpoint = ledger_selectors.checkpoint_latest(run=run)
    item = recovery_selectors.item_unresolved(run=run)
    return _as_served(
        RunDetailOut,
        {
            **dict(RunOut.from_orm(run)),
            "actions": _shown(newest, run.pk),
            "actions_next": f"/api/v1/runs/{run_id}/actions" if more else None,
            "latest_checkpoint": CheckpointOut.from_orm(checkpoint) if checkpoint else None,
            "recovery_item": RecoveryItemOut.from_orm(item) if item else None,
            "warnings": ledger_selectors.run_warnings(run=run),
        },
    )


def _orm_actions(key: AgentKey, run_id: str, cursor: str | None, limit: int) -> bytes:
    run = ledger_selectors.run_get(reach=Reach.of_key(key), run_id=run_id)
    rows = ledger_selectors.run_actions_page(run=run, cursor=cursor, limit=limit)
    return _as_served(ActionPageOut, {"items": _shown(rows.items, run.pk), "next_cursor": rows.next_cursor})


def _orm_checkpoints(key: AgentKey, run_id: str, cursor: str | None, limit: int) -> bytes:
    run = ledger_selectors.run_get(reach=Reach.of_key(key), run_id=run_id)
    rows = keyset_page(Checkpoint.objects.filter(run=run), keys=NEWEST_FIRST, cursor=cursor, limit=limit)
    return _as_served(
        CheckpointPageOut,
        {"items": [CheckpointOut.from_orm(c) for c in rows.items], "next_cursor": rows.next_cursor},
    )


@pytest.fixture
def busy_run(api: Api, approver_key, onboarding_policies, tenant) -> dict[str, Any]:
    """A run with most of what a read shows: an irreversible e-mail then a reversible step (a
    pivot-order warning), compensations, a gateway, an unknown outcome, a charge two people must
    approve (one has), agent JSON with a key order of its own and an integer beyond 64 bits,
    checkpoints written in the same instant, and the failure's recovery item."""
    load_policy_file({"policies": [charge_policy(rules=TWO_FOR_BIG)]}, tenant=tenant)
    run = new_run(api)
    run_id = run["id"]
    new_action(api, run_id, key="mail", tool="email.send_welcome", compensation=None)
    lic = new_action(api, run_id, key="lic", tool="workspace.provision_license", compensation=None)
    crm = new_action(
        api,
        run_id,
        key="crm",
        tool="crm.update_contact",
        args={"z": 1, "a": {"big": 2**70, "f": 1.5, "s": "é\u2028"}, "m": [None, True]},
        before_snapshot={"owner": "x"},
        compensation={"tool": "crm.update_contact.restore", "args": {"owner": "x"}},
        via={"gateway": "saga-mcp/1.0", "upstream": "https://mcp.example.com/mcp"},
    )
    assert api.post(f"/actions/{crm['id']}/start").status_code == 200
    assert (
        api.post(
            f"/actions/{crm['id']}/fail",
            {"error": "timeout", "retryable": True, "layer": "tool", "outcome_unknown": True},
        ).status_code
        == 200
    )
    charge = api.post(
        f"/runs/{run_id}/actions",
        {"tool": "payments.charge", "args": {"amount": 50000}, "idempotency_key": "big"},
    )
    assert charge.status_code == 201, charge.content
    for name in ("one", "two", "three"):
        assert (
            api.post(f"/runs/{run_id}/checkpoints", {"name": name, "state": {"b": 1, "a": [2]}}).status_code
            == 201
        )
    # Written in one instant: the pages keep their order by id.
    first = Checkpoint.objects.filter(run_id=run_id).order_by("created_at").first()
    assert first is not None
    Checkpoint.objects.filter(run_id=run_id).update(created_at=first.created_at)
    # One of the two approvers grants the charge; the run then fails, withdrawing it (a run does
    # not end with an approval outstanding): the read shows the grant on the withdrawn approval.
    approval_id = charge.json()["approval"]["id"]
    assert Api(approver_key[1]).post(f"/approvals/{approval_id}/approve", {"reason": "ok"}).status_code == 200
    failed = api.post(
        f"/runs/{run_id}/fail", {"error": "boom", "failed_action_id": lic["id"], "withdraw_approvals": True}
    )
    assert failed.status_code == 200, failed.content
    return run


def test_the_reads_answer_what_the_orms_reads_answered_byte_for_byte(api, agent_key, busy_run):
    run_id = busy_run["id"]
    key = agent_key[0]
    detail = api.get(f"/runs/{run_id}")
    assert detail.status_code == 200
    assert detail.content == _orm_run_detail(key, run_id)
    codes = [w["code"] for w in detail.json()["warnings"]]
    assert "pivot_order" in codes and "outcome_unknown" in codes
    shown = detail.json()["actions"][-1]["approval"]
    assert len(shown["grants"]) == 1 and shown["status"] == "expired"
    # Every page of the actions and the checkpoints, the cursors included.
    for path, reference, limit in (
        (f"/runs/{run_id}/actions", _orm_actions, 2),
        (f"/runs/{run_id}/checkpoints", _orm_checkpoints, 2),
    ):
        cursor = None
        pages = 0
        while True:
            params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
            response = api.get(path, params)
            assert response.status_code == 200, response.content
            assert response.content == reference(key, run_id, cursor, limit)
            pages += 1
            cursor = response.json()["next_cursor"]
            if cursor is None:
                break
        assert pages >= 2


def test_each_read_is_one_round_trip(api, busy_run):
    run_id = busy_run["id"]
    for path in (f"/runs/{run_id}", f"/runs/{run_id}/actions", f"/runs/{run_id}/checkpoints"):
        assert api.get(path).status_code == 200  # the key in this process's cache, as for an agent at work
        with round_trips() as trips:
            assert api.get(path).status_code == 200
        assert trips.count == 1, (path, trips.messages)


def test_a_reads_queries_do_not_grow_with_the_run(api, onboarding_policies):
    short, long = new_run(api), new_run(api)
    new_action(api, short["id"], key="s-0")
    for n in range(120):  # more than GET /runs/{id} shows (100): the newest are read, not all
        new_action(api, long["id"], key=f"l-{n}")
    for suffix in ("", "/actions", "/checkpoints"):
        counts = []
        for run in (short, long):
            api.get(f"/runs/{run['id']}{suffix}")
            with CaptureQueriesContext(connection) as ctx:
                assert api.get(f"/runs/{run['id']}{suffix}").status_code == 200
            counts.append(len(ctx.captured_queries))
        assert counts[0] == counts[1] == 1, (suffix, counts)
    body = api.get(f"/runs/{long['id']}").json()
    assert len(body["actions"]) == 100 and body["actions_next"] == f"/api/v1/runs/{long['id']}/actions"


@pytest.mark.parametrize(
    "cursor",
    ["garbage", "W1siYSJdXQ", "WyJ4Il0", "WzEsMl0", "WzEuNSwiYWN0X3giXQ", "W251bGwsbnVsbF0", "x" * 300],
)
def test_a_forged_cursor_is_a_422_and_reads_nothing(api, busy_run, cursor):
    run_id = busy_run["id"]
    for path in (f"/runs/{run_id}/actions", f"/runs/{run_id}/checkpoints"):
        with CaptureQueriesContext(connection) as ctx:
            response = api.get(path, {"cursor": cursor})
        assert response.status_code == 422, (path, cursor, response.content)
        assert error_of(response)["code"] in ("invalid_request", "validation_failed")
        assert len(ctx.captured_queries) == 0


def test_another_agents_or_tenants_run_is_not_found_by_any_read(api, outsider_api, busy_run, tenant):
    from tests.factories import issue_key

    other_agent = Api(issue_key(tenant, "someone-else", "agent")[1])
    run_id = busy_run["id"]
    for caller in (outsider_api, other_agent):
        for suffix in ("", "/actions", "/checkpoints"):
            response = caller.get(f"/runs/{run_id}{suffix}")
            assert (response.status_code, error_of(response)["code"]) == (404, "not_found")
    # A key with the operator scope reads every run of its tenant.
    operator = Api(issue_key(tenant, "supervisor", "operator")[1])
    assert operator.get(f"/runs/{run_id}").content == api.get(f"/runs/{run_id}").content
    assert Run.objects.filter(pk=run_id).exists()
