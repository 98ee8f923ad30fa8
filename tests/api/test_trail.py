from __future__ import annotations

import pytest
from django.utils import timezone

from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.services import runs
from ledger.services.actions import moves
from recovery.actions.approvals import approval_reject
from recovery.models import Approval, Unwind, UnwindStep
from tests.factories import new_action, new_run

pytestmark = pytest.mark.django_db


def _succeed(api, run_id: str, key: str, **fields) -> Action:
    action = new_action(api, run_id, key=key, **fields)
    api.post(f"/actions/{action['id']}/start")
    api.post(f"/actions/{action['id']}/succeed", {"result": {"ok": True}})
    return Action.objects.get(pk=action["id"])


def _step(unwind: Unwind, action: Action, position: int, status: str, error: str = "") -> UnwindStep:
    return UnwindStep.objects.create(
        unwind=unwind,
        action=action,
        position=position,
        tool=action.compensation_tool,
        args=action.compensation_args,
        strategy=action.compensation_strategy,
        status=status,
        idempotency_key=f"step-{action.pk}",
        error=error,
        finished_at=timezone.now(),
    )


def test_the_trail_tells_what_changed_was_restored_and_could_not_be_undone(
    api, agent, alice, bob, onboarding_policies
):
    run = new_run(api)
    user = _succeed(api, run["id"], "user")
    license_ = _succeed(
        api,
        run["id"],
        "license",
        tool="workspace.provision_license",
        compensation={"tool": "workspace.cancel_license", "args": {"email": "ashu@company.com"}},
    )
    email = _succeed(api, run["id"], "email", tool="email.send_welcome", compensation=None)
    charge = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.charge", "idempotency_key": "charge", "args": {"amount": 100}},
    ).json()
    approval_reject(
        approval=Approval.objects.get(pk=charge["approval"]["id"]),
        actor=Actor.for_user(bob),
        reason="not part of onboarding",
    )
    api.post(f"/runs/{run['id']}/fail", {"error": "mail gateway 429", "failed_action_id": email.pk})

    # What the unwind did, as the engine records it: the user was deleted, the license cancel failed.
    model = Run.objects.get(pk=run["id"])
    runs.run_compensation_started(run=model, actor=Actor.for_user(alice), reason="undo the onboarding")
    unwind = Unwind.objects.create(tenant=model.tenant, run=model, reason="undo the onboarding")
    for position, (action, outcome, error) in enumerate(
        [(license_, "failed", "license API 500"), (user, "done", "")]
    ):
        step = _step(unwind, action, position, outcome, error)
        moves.action_compensation_started(action=action, actor=Actor.system("unwind"), step_id=step.pk)
        moves.action_compensation_finished(
            action=action, actor=Actor.system("unwind"), outcome=outcome, step_id=step.pk
        )
    runs.run_compensation_finished(run=model, actor=Actor.system("unwind"), complete=False)

    response = api.get(f"/runs/{run['id']}/trail")
    assert response.status_code == 200
    trail = response.json()
    assert [c["tool"] for c in trail["changed"]] == [
        "hr.create_user",
        "workspace.provision_license",
        "email.send_welcome",
    ]
    assert [(r["tool"], r["how"]) for r in trail["restored"]] == [
        ("hr.create_user", "undone by hr.delete_user")
    ]
    not_undone = {n["tool"]: n["reason"] for n in trail["not_undone"]}
    assert not_undone == {
        "workspace.provision_license": "its compensation failed (license API 500)",
        "email.send_welcome": "it cannot be undone",
    }
    reviewers = {(r["who"], r["role"], r["decision"]) for r in trail["reviewed_by"]}
    assert reviewers == {("bob", "approver", "rejected"), ("alice", "operator", "requested compensation")}
    assert "It made 3 changes" in trail["summary"]
    assert "Put back: hr.create_user on user ashu@company.com." in trail["summary"]
    assert (
        "Not undone: email.send_welcome on user ashu@company.com, because it cannot be undone."
        in trail["summary"]
    )
    assert "Reviewed by alice, bob." in trail["summary"]
    assert trail["audit_url"] == f"http://testserver/runs/{run['id']}/#audit"


def test_a_succeeded_runs_trail_says_every_change_stands(api, onboarding_policies):
    run = new_run(api)
    _succeed(api, run["id"], "user")
    api.post(f"/runs/{run['id']}/complete")
    trail = api.get(f"/runs/{run['id']}/trail").json()
    assert len(trail["changed"]) == 1 and trail["restored"] == [] and trail["not_undone"] == []
    assert trail["reviewed_by"] == []
    assert "Every change stands, as intended." in trail["summary"]


def test_a_run_that_changed_nothing_says_so(api):
    run = new_run(api)
    assert "It changed nothing outside Saga Admin." in api.get(f"/runs/{run['id']}/trail").json()["summary"]
