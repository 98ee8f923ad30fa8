"""Approvals that need more than one person, through the API (and the dashboard for a person):
one grant is not enough, the same approver twice counts once (409 ``already_granted``), the
requester never grants, a rejection by anyone rejects, and every grant is audited."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ledger.models import Event
from recovery.models import Approval, ApprovalGrant
from tests.factories import charge_policy, issue_key, load_policy_file, new_run
from tests.support.api import Api, error_of

TWO_FOR_BIG = [{"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approvers": 2}}]


def _approver(tenant, name: str) -> Api:
    """An approver key of a person of its own (``<name>-owner``)."""
    return Api(issue_key(tenant, name, "approver")[1])


@pytest.fixture
def big_charge(db, api):
    """A 50,000 charge awaiting the approval of two people: (run, action)."""
    load_policy_file({"policies": [charge_policy(rules=TWO_FOR_BIG)]})
    run = new_run(api)
    response = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.charge", "args": {"amount": 50000}, "idempotency_key": "big"},
    )
    assert response.status_code == 201, response.content
    return run, response.json()


def _approve(approver: Api, approval_id: str, reason: str = "checked the invoice"):
    return approver.post(f"/approvals/{approval_id}/approve", {"reason": reason})


def test_it_needs_two_distinct_approvers(tenant, api, approver_key, big_charge):
    _, action = big_charge
    approval_id = action["approval"]["id"]
    first = _approve(Api(approver_key[1]), approval_id)
    assert first.status_code == 200, first.content
    body = first.json()
    assert (body["status"], body["approvers_required"]) == ("pending", 2)
    assert [(g["by"], g["reason"]) for g in body["grants"]] == [
        ("trent (approver key approval-bot)", "checked the invoice")
    ]
    # One is not enough: the agent still may not start it.
    polled = api.get(f"/actions/{action['id']}").json()
    assert polled["status"] == "awaiting_approval"
    assert (polled["approval"]["approvers_required"], len(polled["approval"]["grants"])) == (2, 1)
    started = api.post(f"/actions/{action['id']}/start")
    assert (started.status_code, error_of(started)["code"]) == (409, "approval_pending")
    granted = Event.objects.get(subject_id=approval_id, kind="approval.granted")
    assert granted.data == {
        "grants": 1,
        "approvers_required": 2,
        "approver": "trent (approver key approval-bot)",
    }

    second = _approve(_approver(tenant, "risk-bot"), approval_id, "second pair of eyes")
    assert second.status_code == 200
    assert second.json()["status"] == "approved"
    assert [g["by"] for g in second.json()["grants"]] == [
        "trent (approver key approval-bot)",
        "risk-bot-owner (approver key risk-bot)",
    ]
    assert api.get(f"/actions/{action['id']}").json()["status"] == "approved"
    assert api.post(f"/actions/{action['id']}/start").status_code == 200
    assert Event.objects.filter(subject_id=approval_id, kind="approval.approved").count() == 1


def test_it_counts_the_same_approver_once(tenant, approver_key, big_charge):
    _, action = big_charge
    approval_id = action["approval"]["id"]
    assert _approve(Api(approver_key[1]), approval_id).status_code == 200
    again = _approve(Api(approver_key[1]), approval_id, "really sure")
    assert again.status_code == 409
    error = error_of(again)
    assert error["code"] == "already_granted"
    assert error["details"] == {"approval_id": approval_id, "approvers_required": 2, "grants": 1}
    # Another key of the same person (here a rotation: the same name) is the same approver.
    rotated = _approve(
        Api(issue_key(tenant, "approval-bot", "approver", owner=approver_key[0].owner)[1]), approval_id
    )
    assert error_of(rotated)["code"] == "already_granted"
    assert Approval.objects.get(pk=approval_id).status == "pending"
    assert ApprovalGrant.objects.filter(approval_id=approval_id).count() == 1
    assert (
        Event.objects.filter(
            subject_id=approval_id, kind="decision.refused", data__code="already_granted"
        ).count()
        == 2
    )


def test_it_never_counts_the_requester(tenant, agent_key, big_charge):
    _, action = big_charge
    # An approver key named after the agent that asked is the requester: it cannot grant.
    same_name = _approver(tenant, agent_key[0].name)
    refused = _approve(same_name, action["approval"]["id"])
    assert (refused.status_code, error_of(refused)["code"]) == (403, "self_approval")
    assert not ApprovalGrant.objects.exists()


def test_it_rejects_on_one_rejection_after_a_grant(tenant, api, approver_key, big_charge):
    _, action = big_charge
    approval_id = action["approval"]["id"]
    assert _approve(Api(approver_key[1]), approval_id).status_code == 200
    rejected = _approver(tenant, "risk-bot").post(
        f"/approvals/{approval_id}/reject", {"reason": "not this month"}
    )
    assert rejected.status_code == 200
    assert rejected.json()["status"] == "rejected"
    assert api.get(f"/actions/{action['id']}").json()["status"] == "rejected"


def test_it_refuses_edited_args_when_several_people_must_grant(approver_key, big_charge):
    _, action = big_charge
    response = Api(approver_key[1]).post(
        f"/approvals/{action['approval']['id']}/approve", {"reason": "smaller", "args": {"amount": 100}}
    )
    assert (response.status_code, error_of(response)["details"]["args"]) == (422, "edit_not_allowed")
    assert not ApprovalGrant.objects.exists()


def test_it_lists_the_grants_in_the_inbox_api(tenant, approver_key, big_charge):
    _, action = big_charge
    approver = Api(approver_key[1])
    _approve(approver, action["approval"]["id"])
    [item] = approver.get("/approvals").json()["items"]
    assert (item["approvers_required"], len(item["grants"])) == (2, 1)


def test_it_asks_again_for_as_many_people(tenant, api, approver_key, big_charge):
    _, action = big_charge
    Api(approver_key[1]).post(f"/approvals/{action['approval']['id']}/reject", {"reason": "wrong customer"})
    again = api.post(f"/approvals/{action['approval']['id']}/request-again", {"reason": "fixed the customer"})
    assert again.status_code == 201, again.content
    assert again.json()["approvers_required"] == 2


def test_a_person_and_an_approver_key_are_two_people_and_the_inbox_says_1_of_2(
    client, bob, approver_key, big_charge
):
    _, action = big_charge
    approval_id = action["approval"]["id"]
    client.force_login(bob)
    page = client.get(reverse("dashboard:approvals"))
    assert "0 of 2 approvers" in page.content.decode()
    approval = Approval.objects.get(pk=approval_id)
    response = client.post(
        reverse("dashboard:approval-approve", args=[approval_id]),
        {f"{approval_id}-reason": "looks right", f"{approval_id}-shown_args_hash": approval.args_hash},
        follow=True,
    )
    html = response.content.decode()
    assert "1 of 2 approvers (bob)" in html and "another approver must grant it too" in html
    assert Approval.objects.get(pk=approval_id).status == "pending"
    run_page = client.get(reverse("dashboard:run-detail", args=[action["run_id"]])).content.decode()
    assert "1 of 2 approvers" in run_page
    assert "amount &gt; 10,000 → critical, manual approval, 2 approvers" in run_page
    assert _approve(Api(approver_key[1]), approval_id).json()["status"] == "approved"
