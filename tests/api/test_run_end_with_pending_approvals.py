"""A run does not end while one of its actions waits for a person's approval: completing or failing
it is 409 ``pending_approvals`` naming the actions (nothing changes), unless the agent withdraws
them (``withdraw_approvals: true``: each approval is withdrawn, ``approval.withdrawn``, and its
action rejected); an operator's cancel always withdraws them. A late decision on a withdrawn
approval is refused."""

from __future__ import annotations

import pytest

from ledger.models import Action, Event, Run
from recovery.models import Approval, RecoveryItem
from tests.factories import new_run
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def gated(api, onboarding_policies) -> tuple[dict, dict]:
    """A run with one action that needs approval (an unknown tool: the conservative default), and
    one that ran: (run, the gated action)."""
    run = new_run(api)
    done = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "hr.create_user", "args": {"email": "a@b.c"}, "idempotency_key": "u"},
    )
    assert done.status_code == 201, done.content
    gated = api.post(f"/runs/{run['id']}/actions", {"tool": "db.drop_table", "idempotency_key": "drop"})
    assert gated.status_code == 201 and gated.json()["status"] == "awaiting_approval", gated.content
    return run, gated.json()


def _unchanged(run_id: str, action_id: str, events_before: int) -> None:
    assert Run.objects.get(pk=run_id).status == "running"
    assert Action.objects.get(pk=action_id).status == "awaiting_approval"
    assert Approval.objects.get(action_id=action_id).status == "pending"
    assert Event.objects.filter(run_id=run_id).count() == events_before
    assert not RecoveryItem.objects.filter(run_id=run_id).exists()


@pytest.mark.parametrize(
    "path, body",
    [("complete", {"summary": "done"}), ("fail", {"error": "gave up"})],
    ids=["complete", "fail"],
)
def test_ending_a_run_with_an_action_awaiting_approval_is_refused_and_names_it(api, gated, path, body):
    run, action = gated
    events_before = Event.objects.filter(run_id=run["id"]).count()
    refused = api.post(f"/runs/{run['id']}/{path}", body)
    assert refused.status_code == 409
    error = error_of(refused)
    assert error["code"] == "pending_approvals"
    assert error["details"] == {"run_id": run["id"], "action_ids": [action["id"]]}
    assert action["id"] in error["message"] and "db.drop_table" in error["message"]
    assert "withdraw_approvals" in error["message"]
    _unchanged(run["id"], action["id"], events_before)


def test_completing_with_withdraw_approvals_withdraws_them_and_rejects_the_action(api, approver_key, gated):
    run, action = gated
    completed = api.post(f"/runs/{run['id']}/complete", {"summary": "done", "withdraw_approvals": True})
    assert completed.status_code == 200, completed.content
    assert completed.json()["status"] == "succeeded"

    approval = Approval.objects.get(action_id=action["id"])
    assert approval.status == "expired" and approval.reason.startswith("withdrawn: the run succeeded")
    assert Action.objects.get(pk=action["id"]).status == "rejected"
    kinds = list(Event.objects.filter(run_id=run["id"]).order_by("id").values_list("kind", flat=True))
    assert kinds[-3:] == ["approval.withdrawn", "action.rejected", "run.completed"]
    # Out of the approver's inbox, and a late decision is refused.
    approver = Api(approver_key[1])
    inbox = approver.get("/approvals")
    assert inbox.status_code == 200 and approval.pk not in {a["id"] for a in inbox.json()["items"]}
    late = approver.post(f"/approvals/{approval.pk}/approve", {"reason": "looks fine"})
    assert late.status_code == 409, late.content
    assert Action.objects.get(pk=action["id"]).status == "rejected"


def test_failing_with_withdraw_approvals_queues_the_run_without_them(api, gated):
    run, action = gated
    failed = api.post(f"/runs/{run['id']}/fail", {"error": "gave up", "withdraw_approvals": True})
    assert failed.status_code == 200, failed.content
    body = failed.json()
    assert body["status"] == "failed" and body["recovery_item"]["status"] == "open"
    assert Approval.objects.get(action_id=action["id"]).status == "expired"
    assert Event.objects.filter(run_id=run["id"], kind="approval.withdrawn").count() == 1


def test_an_operator_cancel_withdraws_the_waiting_approvals(api, operator_key, gated):
    run, action = gated
    cancelled = Api(operator_key[1]).post(
        f"/runs/{run['id']}/cancel", {"reason": "the user withdrew the request"}
    )
    assert cancelled.status_code == 200, cancelled.content
    approval = Approval.objects.get(action_id=action["id"])
    assert (
        approval.status == "expired" and approval.reason == "withdrawn: the run was cancelled while it waited"
    )
    withdrawn = Event.objects.get(run_id=run["id"], kind="approval.withdrawn")
    cancel = Event.objects.get(run_id=run["id"], kind="run.cancelled")
    # Audited as the operator key that cancelled, not as the system.
    assert (withdrawn.actor_type, withdrawn.actor_label) == (cancel.actor_type, cancel.actor_label)
    assert withdrawn.actor_type == "agent_key"
    assert Action.objects.get(pk=action["id"]).status == "rejected"


def test_a_run_whose_approvals_were_decided_completes_as_before(api, approver_key, gated):
    run, action = gated
    rejected = Api(approver_key[1]).post(f"/approvals/{action['approval']['id']}/reject", {"reason": "no"})
    assert rejected.status_code == 200, rejected.content
    completed = api.post(f"/runs/{run['id']}/complete", {})
    assert completed.status_code == 200 and completed.json()["status"] == "succeeded"
    assert not Event.objects.filter(run_id=run["id"], kind="approval.withdrawn").exists()


@pytest.mark.parametrize("value", ["true", 1, None, {"yes": True}], ids=["string", "int", "null", "object"])
def test_withdraw_approvals_takes_a_boolean_only(api, gated, value):
    run, action = gated
    events_before = Event.objects.filter(run_id=run["id"]).count()
    refused = api.post(f"/runs/{run['id']}/complete", {"withdraw_approvals": value})
    assert refused.status_code == 422, refused.content
    assert error_of(refused)["code"] == "invalid_request"
    _unchanged(run["id"], action["id"], events_before)


def test_a_replayed_withdrawing_complete_answers_the_first_response(api, gated):
    run, action = gated
    body = {"summary": "done", "withdraw_approvals": True}
    first = api.post(f"/runs/{run['id']}/complete", body, headers={"Idempotency-Key": "end-1"})
    again = api.post(f"/runs/{run['id']}/complete", body, headers={"Idempotency-Key": "end-1"})
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert Event.objects.filter(run_id=run["id"], kind="approval.withdrawn").count() == 1


def test_another_tenant_cannot_end_the_run(outsider_api, gated):
    run, action = gated
    for path, body in (
        ("complete", {"withdraw_approvals": True}),
        ("fail", {"error": "x", "withdraw_approvals": True}),
    ):
        response = outsider_api.post(f"/runs/{run['id']}/{path}", body)
        assert response.status_code == 404 and error_of(response)["code"] == "not_found"
    assert Approval.objects.get(action_id=action["id"]).status == "pending"
