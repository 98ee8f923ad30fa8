from __future__ import annotations

import pytest

from ledger.audit import Actor
from ledger.models import Action, Run
from recovery.actions.approvals import approval_approve, approval_reject
from recovery.models import Approval, RecoveryItem
from tests.factories import new_action, new_run
from tests.support.api import error_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(api, onboarding_policies):
    return new_run(api)


def test_it_records_a_planned_action_with_its_policy(api, run):
    action = new_action(api, run["id"], intent={"reasoning": "HR asked for it", "confidence": 0.82})
    assert action["id"].startswith("act_") and action["status"] == "planned"
    assert action["risk"] == "medium" and action["action_class"] == "internal_update"
    assert action["requires_approval"] is False and action["approval"] is None
    assert action["policy"]["pattern"] == "hr.create_user"
    assert action["compensation"] == {
        "strategy": "custom",
        "tool": "hr.delete_user",
        "args": {"email": "ashu@company.com"},
    }
    assert action["intent"] == {"reasoning": "HR asked for it", "confidence": 0.82}


def test_the_same_key_and_payload_replays_the_action(api, run):
    first = new_action(api, run["id"], key="create-ashu")
    replay = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "hr.create_user",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"name": "Ashu Kumar", "email": "ashu@company.com"},
            "idempotency_key": "create-ashu",
            "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
            # The agent re-thought its reasoning on retry: still the same call.
            "intent": {"reasoning": "retrying after a timeout"},
        },
    )
    assert replay.status_code == 200
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == first["id"]
    assert Action.objects.filter(run_id=run["id"]).count() == 1


def test_a_replay_after_success_carries_the_stored_result(api, run):
    action = new_action(api, run["id"], key="create-ashu")
    api.post(f"/actions/{action['id']}/start")
    api.post(f"/actions/{action['id']}/succeed", {"result": {"user_id": 17}})
    replay = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "hr.create_user",
            "target_type": "user",
            "target_id": "ashu@company.com",
            "args": {"email": "ashu@company.com", "name": "Ashu Kumar"},
            "idempotency_key": "create-ashu",
            "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@company.com"}},
        },
    )
    assert replay.status_code == 200
    assert replay.json()["status"] == "succeeded" and replay.json()["result"] == {"user_id": 17}


def test_the_same_key_with_another_payload_is_refused(api, run):
    new_action(api, run["id"], key="create-ashu")
    response = api.post(
        f"/runs/{run['id']}/actions",
        {
            "tool": "hr.create_user",
            "idempotency_key": "create-ashu",
            "args": {"email": "someone-else@company.com"},
        },
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "idempotency_key_reused"


def test_the_key_may_come_from_the_header(api, run):
    body = {"tool": "hr.create_user", "args": {"email": "a@b.c"}}
    first = api.post(f"/runs/{run['id']}/actions", body, headers={"Idempotency-Key": "hdr-1"})
    assert first.status_code == 201 and first.json()["idempotency_key"] == "hdr-1"
    again = api.post(f"/runs/{run['id']}/actions", body, headers={"Idempotency-Key": "hdr-1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


def test_a_missing_or_contradictory_key_is_invalid(api, run):
    missing = api.post(f"/runs/{run['id']}/actions", {"tool": "hr.create_user"})
    assert missing.status_code == 422 and error_of(missing)["code"] == "invalid_request"
    contradictory = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "hr.create_user", "idempotency_key": "a"},
        headers={"Idempotency-Key": "b"},
    )
    assert contradictory.status_code == 422


def test_an_unknown_tool_gets_the_conservative_default_and_waits_for_approval(api, run):
    response = api.post(f"/runs/{run['id']}/actions", {"tool": "db.drop_table", "idempotency_key": "drop"})
    body = response.json()
    assert body["risk"] == "high" and body["requires_approval"] is True
    assert body["status"] == "awaiting_approval"
    # Said, not silent: a mistyped tool name lands here and waits for an approval nobody expected.
    (warning,) = [w for w in body["warnings"] if w["code"] == "default_policy"]
    assert warning["message"] == (
        "No policy names db.drop_table; the default applied (risk high, approval manual). "
        "Check the tool's name, or add a policy for it."
    )
    named = new_action(api, run["id"])
    assert "default_policy" not in {w["code"] for w in named["warnings"]}
    assert body["approval"]["status"] == "pending" and body["approval"]["id"].startswith("apr_")
    assert body["approval"]["expires_at"]


def test_a_gated_action_starts_only_after_approval_with_the_approved_args(api, run, bob):
    action = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.charge", "idempotency_key": "charge", "args": {"amount": 100, "currency": "EUR"}},
    ).json()
    blocked = api.post(f"/actions/{action['id']}/start")
    assert blocked.status_code == 409 and error_of(blocked)["code"] == "approval_pending"

    approval = Approval.objects.get(pk=action["approval"]["id"])
    approval_approve(
        approval=approval,
        actor=Actor.for_user(bob),
        reason="half is enough",
        args={"amount": 50, "currency": "EUR"},
    )
    polled = api.get(f"/actions/{action['id']}").json()
    assert polled["status"] == "approved"
    assert polled["args"] == {"amount": 50, "currency": "EUR"}
    assert polled["approval"]["status"] == "approved" and polled["approval"]["edited"] is True
    assert polled["approval"]["approved_args"] == {"amount": 50, "currency": "EUR"}

    started = api.post(f"/actions/{action['id']}/start")
    assert started.status_code == 200 and started.json()["status"] == "running"


def test_a_rejected_action_cannot_start(api, run, bob):
    action = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.charge", "idempotency_key": "charge", "args": {"amount": 100}},
    ).json()
    approval_reject(
        approval=Approval.objects.get(pk=action["approval"]["id"]),
        actor=Actor.for_user(bob),
        reason="wrong customer",
    )
    assert api.get(f"/actions/{action['id']}").json()["approval"]["reason"] == "wrong customer"
    response = api.post(f"/actions/{action['id']}/start")
    assert response.status_code == 409 and error_of(response)["code"] == "approval_rejected"


def test_start_succeed_records_result_snapshot_and_completion_order(api, run):
    action = new_action(api, run["id"])
    started = api.post(f"/actions/{action['id']}/start").json()
    assert started["status"] == "running" and started["attempts"] == 1
    done = api.post(
        f"/actions/{action['id']}/succeed", {"result": {"user_id": 17}, "after_snapshot": {"active": True}}
    )
    assert done.status_code == 200
    body = done.json()
    assert body["status"] == "succeeded" and body["result"] == {"user_id": 17}
    assert body["after_snapshot"] == {"active": True} and body["completion_seq"] == 1


def test_succeeding_an_action_that_never_started_is_an_invalid_transition(api, run):
    action = new_action(api, run["id"])
    response = api.post(f"/actions/{action['id']}/succeed", {"result": None})
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "invalid_transition" and error["details"]["current"] == "planned"


def test_a_failed_action_may_start_again_with_the_same_key(api, run):
    action = new_action(api, run["id"])
    api.post(f"/actions/{action['id']}/start")
    failed = api.post(
        f"/actions/{action['id']}/fail", {"error": "HR API 503", "retryable": True, "layer": "tool"}
    )
    assert failed.status_code == 200 and failed.json()["status"] == "failed"
    assert failed.json()["retryable"] is True and failed.json()["error_layer"] == "tool"
    retried = api.post(f"/actions/{action['id']}/start")
    assert retried.json()["status"] == "running" and retried.json()["attempts"] == 2


def test_an_unknown_outcome_queues_the_run_until_it_is_reconciled(api, run):
    action = new_action(api, run["id"])
    api.post(f"/actions/{action['id']}/start")
    response = api.post(
        f"/actions/{action['id']}/fail",
        {"error": "read timeout after 30s", "retryable": True, "layer": "tool", "outcome_unknown": True},
    )
    assert response.json()["status"] == "unknown"
    item = RecoveryItem.objects.get(run_id=run["id"])
    assert item.reason == "outcome_unknown" and item.failed_action_id == action["id"]
    # Neither resume nor a plain retry may treat it: starting it again is refused.
    assert api.post(f"/actions/{action['id']}/start").status_code == 409

    reconciled = api.post(
        f"/actions/{action['id']}/reconcile",
        {"happened": True, "reason": "user exists in HR", "result": {"user_id": 17}},
    )
    assert reconciled.status_code == 200
    assert reconciled.json()["status"] == "succeeded" and reconciled.json()["result"] == {"user_id": 17}


def test_reconciling_as_not_happened_marks_it_failed(api, run):
    action = new_action(api, run["id"])
    api.post(f"/actions/{action['id']}/start")
    api.post(
        f"/actions/{action['id']}/fail",
        {"error": "timeout", "retryable": True, "layer": "tool", "outcome_unknown": True},
    )
    response = api.post(
        f"/actions/{action['id']}/reconcile", {"happened": False, "reason": "no such user in HR"}
    )
    assert response.json()["status"] == "failed"
    again = api.post(f"/actions/{action['id']}/reconcile", {"happened": False, "reason": "twice"})
    assert again.status_code == 409


def test_a_verification_mismatch_fails_the_run_into_the_queue(api, run):
    action = new_action(api, run["id"])
    api.post(f"/actions/{action['id']}/start")
    api.post(f"/actions/{action['id']}/succeed", {"result": {"user_id": 17}})
    ok = api.post(f"/actions/{action['id']}/verify", {"ok": True})
    assert ok.status_code == 200 and ok.json()["verified"] is True and ok.json()["recovery_item"] is None

    response = api.post(
        f"/actions/{action['id']}/verify",
        {"ok": False, "expected": {"active": True}, "actual": {"active": False}, "reason": "user inactive"},
    )
    assert response.status_code == 200
    assert response.json()["verified"] is False
    assert response.json()["recovery_item"]["reason"] == "verification_failed"
    assert Run.objects.get(pk=run["id"]).status == "failed"


def test_verifying_a_planned_action_is_an_invalid_transition(api, run):
    action = new_action(api, run["id"])
    response = api.post(f"/actions/{action['id']}/verify", {"ok": True})
    assert response.status_code == 409 and error_of(response)["code"] == "invalid_transition"


def test_fail_needs_its_layer_and_retryable(api, run):
    action = new_action(api, run["id"])
    api.post(f"/actions/{action['id']}/start")
    response = api.post(
        f"/actions/{action['id']}/fail", {"error": "x", "layer": "network", "retryable": False}
    )
    assert response.status_code == 422
    fields = {e["field"] for e in error_of(response)["details"]["errors"]}
    assert fields == {"layer"}
