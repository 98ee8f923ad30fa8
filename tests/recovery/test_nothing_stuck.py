"""Nothing stuck: an expired or rejected approval is asked again, a long
compensation step keeps its lease while its worker lives, a running unwind is stopped between
steps, and a compensator removed after the unwind was planned fails naming itself. Services, the
API through the real URL stack, the dashboard views, and real ``saga_worker`` processes where
timing and processes matter."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Compensator, Event, Run
from ledger.services import runs
from ledger.services.keys import agent_key_create
from recovery import compensators
from recovery.actions.approvals import approval_approve, approval_request_again
from recovery.actions.compensations import unwind_start, unwind_stop
from recovery.actions.periodic import approvals_expire
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from recovery.unwinds.advance import unwind_advance_and_claim, unwind_advance_move
from recovery.unwinds.runner import step_record_outcome, step_run
from tests.factories import (
    HR_PATH,
    WS_PATH,
    failed_saga,
    gated_run,
    load_onboarding_policies,
    load_reliability_policies,
    onboarding_saga,
)
from tests.support.api import Api, error_of
from tests.support.processes import Reply, dump_worker_logs, wait_for

# Real saga_worker processes, leases and sweeps: the slow lane (`make test-fast` leaves it out).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _expire(approval: Approval) -> None:
    assert approvals_expire(now=approval.expires_at + timedelta(seconds=1)) >= 1
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED


def _events(run: Run, kind: str) -> list[Event]:
    return list(Event.objects.filter(run=run, kind=kind).order_by("id"))


# --- Asking again for an approval ----------------------------------------------------------------


def test_the_agent_asks_again_for_its_expired_action_approval_and_the_action_can_then_run(
    tenant, agent, agent_key, approver_key
):
    run, action, approval = gated_run(tenant, agent)
    _expire(approval)
    action.refresh_from_db()
    assert action.status == Action.Status.REJECTED
    api = Api(agent_key[1])
    assert error_of(api.post(f"/actions/{action.pk}/start"))["code"] == "approval_rejected"

    response = api.post(f"/approvals/{approval.pk}/request-again", {"reason": "the approver was on leave"})

    assert response.status_code == 201, response.content
    asked = response.json()
    assert asked["previous_id"] == approval.pk and asked["id"] != approval.pk
    assert (asked["status"], asked["tool"], asked["args"], asked["kind"]) == (
        "pending",
        approval.tool,
        approval.args,
        "action",
    )
    again = Approval.objects.get(pk=asked["id"])
    assert again.previous == approval and again.requested_by_key == agent_key[0]
    assert again.expires_at > approval.expires_at
    action.refresh_from_db()
    assert action.status == Action.Status.AWAITING_APPROVAL
    # The agent polls the action and sees the new approval, not the expired one.
    polled = api.get(f"/actions/{action.pk}").json()
    assert polled["status"] == "awaiting_approval" and polled["approval"]["id"] == again.pk
    requested = _events(run, "approval.requested_again")
    assert len(requested) == 1 and requested[0].reason == "the approver was on leave"
    assert requested[0].actor_label == "onboarding-agent"
    assert requested[0].data["previous_id"] == approval.pk

    # The old one cannot be asked a second time, nor the pending new one.
    assert error_of(api.post(f"/approvals/{approval.pk}/request-again", {"reason": "again"}))["code"] == (
        "already_asked_again"
    )
    pending = api.post(f"/approvals/{again.pk}/request-again", {"reason": "again"})
    assert pending.status_code == 409 and error_of(pending)["code"] == "invalid_transition"
    assert "still pending" in error_of(pending)["message"]

    approver = Api(approver_key[1])
    assert approver.post(f"/approvals/{again.pk}/approve", {"reason": "fine now"}).status_code == 200
    approved = api.post(f"/approvals/{again.pk}/request-again", {"reason": "again"})
    assert approved.status_code == 409 and "was approved" in error_of(approved)["message"]
    started = api.post(f"/actions/{action.pk}/start")
    assert started.status_code == 200 and started.json()["status"] == "running"
    assert Approval.objects.filter(action=action).count() == 2


def test_only_the_agent_that_owns_the_run_asks_again_for_an_action_approval(
    tenant, other_tenant, agent, agent_key, operator_key, approver_key, outsider_key, alice
):
    run, action, approval = gated_run(tenant, agent)
    approver = Api(approver_key[1])
    approver.post(f"/approvals/{approval.pk}/reject", {"reason": "not this amount"})
    approval.refresh_from_db()
    assert approval.status == Approval.Status.REJECTED
    other_agent = agent_key_create(
        tenant=tenant, name="billing-agent", scopes=["agent"], actor=Actor.system("tests")
    ).secret
    body = {"reason": "please"}

    assert approver.post(f"/approvals/{approval.pk}/request-again", body).status_code == 403
    operator = Api(operator_key[1]).post(f"/approvals/{approval.pk}/request-again", body)
    assert operator.status_code == 403 and "owns run" in error_of(operator)["message"]
    assert Api(other_agent).post(f"/approvals/{approval.pk}/request-again", body).status_code == 404
    assert Api(outsider_key[1]).post(f"/approvals/{approval.pk}/request-again", body).status_code == 404
    with pytest.raises(errors.Forbidden):
        approval_request_again(approval=approval, actor=Actor.for_user(alice), reason="please")
    assert Api(agent_key[1]).post(f"/approvals/{approval.pk}/request-again", {}).status_code == 422

    # Nothing changed, and the refusals that reached the service are in the audit log.
    assert Approval.objects.filter(action=action).count() == 1
    action.refresh_from_db()
    assert action.status == Action.Status.REJECTED
    refused = [e for e in _events(run, "decision.refused") if e.data["decision"] == "request_approval_again"]
    assert {e.actor_label for e in refused} >= {"supervisor", "alice"}

    # A run that no longer takes writes does not get its action asked again either.
    runs.run_fail(run=run, actor=agent, error="gave up", reason="failed")
    closed = Api(agent_key[1]).post(f"/approvals/{approval.pk}/request-again", body)
    assert closed.status_code == 409 and error_of(closed)["code"] == "run_not_accepting_actions"
    assert Approval.objects.filter(action=action).count() == 1


def ok_undo(**_fields: object) -> dict[str, object]:
    return {"state": "undone"}


def _compensators_in_python() -> None:
    for tool in ("workspace.cancel_license", "hr.delete_user"):
        Compensator.objects.update_or_create(
            tenant=None,
            tool=tool,
            defaults={"kind": "python", "python_path": "tests.recovery.test_nothing_stuck.ok_undo"},
        )


def _run_queued_steps(unwind: Unwind) -> None:
    """Drive the unwind in-process until nothing is queued (what a worker does)."""
    for _ in range(10):
        unwind_advance_move(unwind_id=unwind.pk)
        queued = unwind.steps.filter(status=UnwindStep.Status.QUEUED).first()
        if queued is None:
            return
        step_run(step_id=queued.pk)


def test_an_operator_asks_again_for_an_expired_step_approval_and_the_first_requester_still_cannot_grant_it(
    tenant, agent, agent_key, operator_key, approver_key, alice, bob
):
    load_onboarding_policies(license_risk="critical")
    _compensators_in_python()
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo the hire")
    unwind_advance_move(unwind_id=unwind.pk)
    approval = Approval.objects.get(step__unwind=unwind)
    step = approval.step
    _expire(approval)
    # The unwind goes on with the other step: asking again waits until it has finished.
    unwind_advance_move(unwind_id=unwind.pk)
    operator = Api(operator_key[1])
    early = operator.post(f"/approvals/{approval.pk}/request-again", {"reason": "ask bob"})
    assert early.status_code == 409 and "finished its other steps" in error_of(early)["message"]
    _run_queued_steps(unwind)
    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.FAILED
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.FAILED
    # Approvers decide, agents ask for their own actions: neither asks again for a step.
    assert (
        Api(approver_key[1]).post(f"/approvals/{approval.pk}/request-again", {"reason": "x"}).status_code
        == 403
    )
    agent_try = Api(agent_key[1]).post(f"/approvals/{approval.pk}/request-again", {"reason": "x"})
    assert agent_try.status_code == 403

    response = operator.post(f"/approvals/{approval.pk}/request-again", {"reason": "bob is back"})

    assert response.status_code == 201, response.content
    again = Approval.objects.get(pk=response.json()["id"])
    assert (again.previous_id, again.kind, again.step_id, again.tool, again.args) == (
        approval.pk,
        "compensation",
        step.pk,
        approval.tool,
        approval.args,
    )
    step.refresh_from_db()
    unwind.refresh_from_db()
    assert step.status == UnwindStep.Status.AWAITING_APPROVAL and step.error == ""
    assert unwind.status == Unwind.Status.PAUSED
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATING
    assert RecoveryItem.objects.get(run=saga.run, status__in=RecoveryItem.UNRESOLVED).status == "claimed"
    assert _events(saga.run, "step.approval_requested_again")[0].reason == "bob is back"

    # Alice asked for the compensation in the first place: asking again does not make her request
    # one she may grant.
    with pytest.raises(errors.SelfApproval):
        approval_approve(approval=again, actor=Actor.for_user(alice), reason="mine anyway")
    approval_approve(approval=again, actor=Actor.for_user(bob), reason="ok, cancel the licence")
    _run_queued_steps(unwind)
    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.COMPLETED
    assert Action.objects.get(pk=saga.provision_license.pk).status == Action.Status.COMPENSATED
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATED


# --- Stopping an unwind ----------------------------------------------------------------------------


def test_an_operator_stops_a_running_unwind_between_steps_with_a_real_worker(
    tenant, agent, operator_key, agent_key, outsider_key, alice, webhooks, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    held = threading.Event()
    webhooks.script[WS_PATH] = [Reply(200, {"state": {"license": None}}, block=held)]
    saga = onboarding_saga(tenant, agent)
    # The held call stays in flight until the test lets it go, not until the suite's 1.5 s webhook
    # timeout: on a busy machine the requests below took longer, and the step had moved on.
    worker = start_worker(SAGA_WEBHOOK_TIMEOUT_S="120")
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="hire withdrawn")
    wait_for(lambda: webhooks.calls_to(WS_PATH), timeout=20, what="the licence step's call")
    operator = Api(operator_key[1])
    assert Api(agent_key[1]).post(f"/unwinds/{unwind.pk}/stop", {"reason": "x"}).status_code == 403
    assert Api(outsider_key[1]).post(f"/unwinds/{unwind.pk}/stop", {"reason": "x"}).status_code == 404
    assert operator.post(f"/unwinds/{unwind.pk}/stop", {}).status_code == 422

    response = operator.post(f"/unwinds/{unwind.pk}/stop", {"reason": "HR says the hire is back on"})

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "cancelled"
    assert [(s["tool"], s["status"]) for s in body["steps"]] == [
        ("workspace.cancel_license", "running"),  # in flight: it finishes
        ("hr.delete_user", "pending"),  # never starts
    ]
    held.set()
    license_step = unwind.steps.get(position=0)
    wait_for(
        lambda: UnwindStep.objects.get(pk=license_step.pk).status == UnwindStep.Status.DONE,
        timeout=20,
        what="the step in flight to finish",
    )
    time.sleep(2)  # time enough for a worker that would (wrongly) go on with the next step
    assert webhooks.calls_to(HR_PATH) == [], dump_worker_logs([worker])
    assert unwind.steps.get(position=1).status == UnwindStep.Status.PENDING
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.CANCELLED
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.FAILED
    statuses = dict(Action.objects.filter(run=saga.run).values_list("tool", "status"))
    assert statuses["workspace.provision_license"] == "compensated"
    assert statuses["hr.create_user"] == "succeeded"

    # The item is back in the queue, saying what was undone and what was not.
    item = RecoveryItem.objects.get(run=saga.run, status__in=RecoveryItem.UNRESOLVED)
    assert item.status == RecoveryItem.Status.OPEN and item.reason == RecoveryItem.Reason.FAILED
    stopped = item.details["stopped"]
    assert stopped["by"] == "supervisor" and stopped["reason"] == "HR says the hire is back on"
    assert [e["action_tool"] for e in stopped["undone"]] == ["workspace.provision_license"]
    assert [e["action_tool"] for e in stopped["not_undone"]] == ["hr.create_user"]
    assert stopped["running"] == []
    assert "stopped by supervisor" in item.error and "Not undone: hr.create_user" in item.error
    event = _events(saga.run, "unwind.stopped")[0]
    assert (event.actor_label, event.reason, event.to_state) == (
        "supervisor",
        "HR says the hire is back on",
        "cancelled",
    )

    # A stopped (finished) unwind cannot be stopped again; nothing changes.
    again = operator.post(f"/unwinds/{unwind.pk}/stop", {"reason": "twice"})
    assert again.status_code == 409 and error_of(again)["code"] == "invalid_transition"
    assert len(_events(saga.run, "unwind.stopped")) == 1

    # The operator decides again: compensating now undoes only what is left.
    second = unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the rest")
    wait_for(
        lambda: Unwind.objects.get(pk=second.pk).status == Unwind.Status.COMPLETED,
        timeout=30,
        what="the second unwind",
    )
    assert [s.tool for s in second.steps.all()] == ["hr.delete_user"]
    assert len(webhooks.calls_to(WS_PATH)) == 1 and len(webhooks.calls_to(HR_PATH)) == 1
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATED


def test_stopping_a_paused_unwind_withdraws_the_approval_it_waits_for(tenant, agent, alice, bob):
    load_onboarding_policies(license_risk="critical")
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    approval = Approval.objects.get(step__unwind=unwind)
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.PAUSED

    unwind_stop(unwind=unwind, actor=Actor.for_user(alice), reason="wrong run")

    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED and approval.reason.startswith("withdrawn")
    assert _events(saga.run, "approval.withdrawn")[0].actor_label == "alice"
    assert [s.status for s in unwind.steps.order_by("position")] == ["pending", "pending"]
    with pytest.raises(errors.InvalidTransition):
        approval_approve(approval=approval, actor=Actor.for_user(bob), reason="late")
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.CANCELLED
    item = RecoveryItem.objects.get(run=saga.run, status__in=RecoveryItem.UNRESOLVED)
    assert item.status == "open" and len(item.details["stopped"]["not_undone"]) == 2
    assert Action.objects.filter(run=saga.run, status=Action.Status.SUCCEEDED).count() == 2


def test_a_step_waiting_for_its_retry_fails_when_the_unwind_stops(tenant, agent, alice):
    load_reliability_policies()
    saga = failed_saga(tenant, agent, steps=2)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    claim = unwind_advance_and_claim(unwind_id=unwind.pk)
    assert claim is not None
    step_record_outcome(
        step_id=claim.step_id, token=claim.token, outcome=compensators.Outcome.retry("503 busy")
    )
    step = UnwindStep.objects.get(pk=claim.step_id)
    assert (step.status, step.attempts) == ("queued", 1)

    unwind_stop(unwind=unwind, actor=Actor.for_user(alice), reason="tool outage, stop")

    step.refresh_from_db()
    assert step.status == UnwindStep.Status.FAILED and step.error.startswith(
        "Not retried: the unwind was stopped"
    )
    # An attempt may have acted: the action says so, for a person to check.
    assert Action.objects.get(pk=step.action_id).status == Action.Status.COMPENSATION_FAILED
    # The queued job that runs later finds nothing to do.
    assert step_run(step_id=step.pk) is None
    assert UnwindStep.objects.get(pk=step.pk).attempts == 1


def test_the_dashboard_stop_page_shows_what_will_happen_then_stops(client, tenant, agent, alice, carol):
    load_reliability_policies()
    saga = failed_saga(tenant, agent, steps=2)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    url = reverse("dashboard:unwind-stop", args=[unwind.pk])
    client.force_login(carol)
    assert client.post(url, {"reason": "viewer"}).status_code == 403
    client.force_login(alice)
    run_page = client.get(reverse("dashboard:run-detail", args=[saga.run.pk])).content.decode()
    assert url in run_page and "Stop unwind" in run_page and 'id="stop-panel"' in run_page

    page = client.get(url).content.decode()
    assert page.count('data-effect="not-started"') == 2 and "Confirm: stop the compensation" in page
    assert client.post(url, {"reason": ""}).status_code == 422
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.RUNNING

    response = client.post(url, {"reason": "wrong customer"})
    assert response.status_code == 303
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.CANCELLED
    run_page = client.get(response["Location"]).content.decode()
    assert "Stopped" in run_page and "Not started" in run_page and "Compensation stopped" in run_page
    refused = client.post(url, {"reason": "again"}, follow=True).content.decode()
    assert "only a running or paused unwind can be stopped" in refused


# --- Long steps keep their lease --------------------------------------------------------------------


def _slow_saga(tenant, agent, tmp_path: Path):
    calls = tmp_path / "calls"
    calls.mkdir()
    load_reliability_policies(python_undo="tests.recovery.slow_compensators.slow_undo", max_attempts=5)
    return failed_saga(tenant, agent, steps=1), calls


def _calls(calls: Path) -> list[list[str]]:
    log = calls / "calls.log"
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def test_a_step_slower_than_its_lease_is_not_taken_over_while_its_worker_lives(
    tenant, agent, alice, start_worker, workers, tmp_path
):
    saga, calls = _slow_saga(tenant, agent, tmp_path)
    # The lease is 3 s here (SAGA_STEP_LEASE_S=2, at least the webhook timeout + 1); the call
    # takes 7 s, and a second worker plus a sweep every second stand ready to take it over.
    for _ in range(2):
        start_worker(SAGA_TEST_CALLS_DIR=str(calls), SAGA_TEST_SLOW_S="7")
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")

    try:
        wait_for(
            lambda: Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.COMPLETED,
            timeout=40,
            what="the slow unwind",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc

    assert [c[0] for c in _calls(calls)] == ["1"]  # exactly one execution
    step = unwind.steps.get()
    assert (step.status, step.attempts, step.lease_token) == ("done", 1, 1)
    assert not Event.objects.filter(run=saga.run, kind="step.lease_expired").exists()
    assert step.finished_at - step.started_at > timedelta(seconds=6)


def test_a_worker_that_dies_mid_slow_step_still_loses_its_lease(
    tenant, agent, alice, start_worker, workers, tmp_path
):
    saga, calls = _slow_saga(tenant, agent, tmp_path)
    first = start_worker(SAGA_TEST_CALLS_DIR=str(calls), SAGA_TEST_SLOW_S="30")
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    wait_for(lambda: _calls(calls), timeout=20, what="the first call")
    first.kill_hard()
    start_worker(SAGA_TEST_CALLS_DIR=str(calls), SAGA_TEST_SLOW_S="30")

    try:
        wait_for(
            lambda: Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.COMPLETED,
            timeout=40,
            what="the takeover",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc

    made = _calls(calls)
    assert [c[0] for c in made] == ["1", "2"] and made[0][1] == made[1][1]  # same idempotency key
    step = unwind.steps.get()
    assert (step.status, step.attempts, step.lease_token) == ("done", 2, 2)
    assert Event.objects.filter(run=saga.run, kind="step.lease_expired", subject_id=step.pk).exists()


# --- A compensator removed after planning ------------------------------------------------------------


def test_a_step_whose_compensator_was_removed_after_planning_fails_naming_it(
    tenant, agent, alice, webhooks, start_worker, workers
):
    load_onboarding_policies(webhooks=webhooks)
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    assert unwind.plan["steps"][0]["compensator"] == "webhook"
    # The policy file is reloaded without it (load_policies removes what the file no longer lists).
    Compensator.objects.filter(tool="workspace.cancel_license").delete()
    start_worker()

    try:
        wait_for(
            lambda: Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.FAILED,
            timeout=30,
            what="the unwind to finish",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc

    step = unwind.steps.get(position=0)
    assert step.status == UnwindStep.Status.FAILED and step.attempts == 1  # permanent: not retried
    assert step.error.startswith("Compensator workspace.cancel_license is no longer registered")
    assert "removed from the policy file" in step.error and "retry this step, or skip it" in step.error
    failed = Event.objects.get(run=saga.run, kind="step.failed", subject_id=step.pk)
    assert failed.data["code"] == "compensator_missing" and failed.reason == step.error
    assert webhooks.calls_to(WS_PATH) == [] and len(webhooks.calls_to(HR_PATH)) == 1
    item = RecoveryItem.objects.get(run=saga.run, status=RecoveryItem.Status.OPEN)
    assert item.reason == RecoveryItem.Reason.COMPENSATION_FAILED
    assert "workspace.cancel_license (failed)" in item.error
    assert item.details["left"][0]["error"] == step.error
    assert Action.objects.get(pk=saga.provision_license.pk).status == Action.Status.COMPENSATION_FAILED
