"""Cancelling a run (the service and ``POST /api/v1/runs/{id}/cancel``), and the rules around it:
actions still running when a run is cancelled or starts compensating get an unknown outcome (never
stuck ``running``), and one closed-to-writes rule for every write of an agent."""

from __future__ import annotations

import django_rq
import pytest
from django.test import Client

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Checkpoint, Event, Run
from ledger.services import checkpoints, runs
from ledger.services.actions import moves
from recovery import selectors
from recovery.actions.cancellations import run_cancel
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.actions.resolutions import item_resume
from recovery.models import AgentCommand, RecoveryItem, Unwind
from tests.factories import (
    force_status,
    load_onboarding_policies,
    load_reliability_policies,
    perform_action,
    record,
)
from tests.support.api import Api, error_of


@pytest.fixture
def run(tenant, agent):
    """Ashu's onboarding under way: the HR record is created, the licence is being provisioned."""
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    perform_action(run, agent, "hr.create_user", target_id="ashu", args={"email": "ashu@company.com"})
    licence = record(
        run, agent, "licence", tool="workspace.provision_license", args={"email": "ashu@company.com"}
    )
    moves.action_start(action=licence, actor=agent)
    run.refresh_from_db()
    return run


def _licence(run: Run) -> Action:
    return Action.objects.get(run=run, tool="workspace.provision_license")


def _state(run: Run) -> tuple:
    """Everything a cancel touches, to show a refusal changed none of it."""
    return (
        Run.objects.get(pk=run.pk).status,
        sorted(Action.objects.filter(run=run).values_list("status", flat=True)),
        list(RecoveryItem.objects.filter(run=run).values_list("pk", "status", "reason")),
        AgentCommand.objects.filter(run=run).count(),
    )


# --- The service -----------------------------------------------------------------------------


def test_it_cancels_a_running_run_in_one_decision(run, agent, alice):
    outcome = run_cancel(run=run, actor=Actor.for_user(alice), reason="Ashu declined the offer")

    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    # The licence call was under way: nobody can say whether it happened, so it is unknown now.
    licence = _licence(run)
    assert licence.status == Action.Status.UNKNOWN
    assert [a.pk for a in outcome.unknown] == [licence.pk]
    event = Event.objects.get(run=run, kind="action.outcome_unknown", subject_id=licence.pk)
    assert (event.from_state, event.to_state, event.actor_label) == ("running", "unknown", "alice")
    assert event.reason == "run cancelled while the action was running"
    # The HR record stands: the run goes to the queue so someone decides whether to undo it.
    item = RecoveryItem.objects.get(run=run)
    assert outcome.item == item
    assert (item.reason, item.status, item.failed_action_id) == ("cancelled", "open", licence.pk)
    assert item.suggested_resolution == RecoveryItem.Suggestion.RECONCILE
    assert item.details["cancel"]["reason"] == "Ashu declined the offer"
    assert item.details["cancel"]["unknown_action_ids"] == [licence.pk]
    # The agent is told on its next heartbeat.
    command = outcome.command
    assert [(c.kind, c.reason) for c in selectors.commands_pending(run=run)] == [
        ("cancel", "Ashu declined the offer")
    ]
    assert command.kind == AgentCommand.Kind.CANCEL
    cancelled = Event.objects.get(run=run, kind="run.cancelled")
    assert (cancelled.actor_label, cancelled.reason, cancelled.from_state) == (
        "alice",
        "Ashu declined the offer",
        "running",
    )


def test_the_agent_can_write_nothing_more_after_a_cancel(run, agent, alice):
    run_cancel(run=run, actor=Actor.for_user(alice), reason="the user withdrew")
    licence = _licence(run)
    hr = Action.objects.get(run=run, tool="hr.create_user")
    with pytest.raises(errors.RunNotAcceptingActions) as refused:
        record(run, agent, "late", tool="email.send_welcome", args={"to": "ashu@company.com"})
    assert refused.value.details == {"run_id": run.pk, "current": "cancelled"}
    with pytest.raises(errors.RunNotAcceptingActions):
        moves.action_succeed(action=licence, actor=agent, result={"seat": 1})
    with pytest.raises(errors.RunNotAcceptingActions):
        moves.action_fail(action=licence, actor=agent, error="late", retryable=False, layer="tool")
    with pytest.raises(errors.RunNotAcceptingActions):
        checkpoints.checkpoint_write(run=run, actor=agent, name="after")
    with pytest.raises(errors.RunNotAcceptingActions):
        moves.action_start(action=hr, actor=agent)
    assert Action.objects.filter(run=run).count() == 2 and Checkpoint.objects.count() == 0
    assert _licence(run).status == Action.Status.UNKNOWN


def test_a_run_that_changed_nothing_is_cancelled_without_a_queue_item(tenant, agent, alice):
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Lee")
    outcome = run_cancel(run=run, actor=Actor.for_user(alice), reason="duplicate request")
    assert outcome.item is None and outcome.unknown == []
    assert not RecoveryItem.objects.filter(run=run).exists()
    assert AgentCommand.objects.get(run=run).kind == "cancel"


def test_it_updates_the_queued_item_of_a_failed_run_instead_of_opening_another(tenant, agent, alice):
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Priya")
    perform_action(run, agent, "hr.create_user", target_id="priya", args={"email": "priya@company.com"})
    item = run_fail_and_queue(run=run, actor=agent, error="licence API down").item
    assert item is not None

    run_cancel(run=run, actor=Actor.for_user(alice), reason="Priya starts next year instead")

    items = list(RecoveryItem.objects.filter(run=run))
    assert [(i.pk, i.reason, i.status) for i in items] == [(item.pk, "cancelled", "open")]
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    # A cancelled run can still be compensated or closed; not resumed.
    with pytest.raises(errors.InvalidTransition):
        item_resume(item=items[0], actor=Actor.for_user(alice), reason="go on")


@pytest.mark.parametrize("state", ["succeeded", "cancelled", "compensating", "compensated", "closed"])
def test_it_refuses_to_cancel_a_run_that_is_over_and_changes_nothing(run, alice, state):
    force_status(run, state)
    before = _state(run)
    with pytest.raises(errors.InvalidTransition) as refused:
        run_cancel(run=run, actor=Actor.for_user(alice), reason="too late")
    assert refused.value.details["current"] == state
    assert _state(run) == before
    # The refusal is in the audit log, with who tried and why.
    event = Event.objects.get(run=run, kind="decision.refused")
    assert (event.actor_label, event.to_state, event.data["code"]) == (
        "alice",
        "cancel",
        "invalid_transition",
    )
    assert event.data["reason_given"] == "too late"


def test_it_refuses_a_cancel_without_a_reason(run, alice):
    before = _state(run)
    with pytest.raises(errors.ValidationFailed):
        run_cancel(run=run, actor=Actor.for_user(alice), reason="   ")
    assert _state(run) == before


def test_the_cancel_is_pushed_to_the_agents_resume_url(
    tenant, agent, alice, settings, django_capture_on_commit_callbacks
):
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1:9"]}
    run = runs.run_create(
        tenant=tenant, actor=agent, agent="a", request="r", resume_url="http://127.0.0.1:9/commands"
    )
    with django_capture_on_commit_callbacks(execute=True):
        outcome = run_cancel(run=run, actor=Actor.for_user(alice), reason="stop")
    queued = django_rq.get_queue("notifications").jobs
    assert [job.kwargs for job in queued] == [{"command_id": outcome.command.pk}]


# --- Nothing stays running -------------------------------------------------------------------


def _failed_with_a_running_action(tenant, agent):
    """Three things done, a fourth under way when the agent reported the run failed."""
    load_reliability_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="reliability", request="change the world")
    for n in (1, 2):
        perform_action(run, agent, f"rel.do_{n}", target_type="thing", target_id=f"thing-{n}", args={"n": n})
    slow = record(run, agent, "slow", tool="rel.do_3", args={"n": 3})
    moves.action_start(action=slow, actor=agent)
    item = run_fail_and_queue(run=run, actor=agent, error="gave up waiting").item
    assert item is not None
    return run, slow, item


def test_a_failed_run_still_takes_the_late_report_of_its_running_action(tenant, agent):
    run, slow, _item = _failed_with_a_running_action(tenant, agent)
    # New work is refused until someone resumes the run ...
    with pytest.raises(errors.RunNotAcceptingActions) as refused:
        record(run, agent, "more", tool="rel.do_4", args={"n": 4})
    assert refused.value.details["current"] == "failed"
    with pytest.raises(errors.RunNotAcceptingActions):
        checkpoints.checkpoint_write(run=run, actor=agent, name="late")
    # ... but how the call under way ended is the truth arriving late, and is recorded.
    moves.action_succeed(action=slow, actor=agent, result={"ok": 3})
    assert Action.objects.get(pk=slow.pk).status == Action.Status.SUCCEEDED


def test_compensation_waits_for_an_action_still_running_and_cancel_unblocks_it(tenant, agent, alice):
    run, slow, item = _failed_with_a_running_action(tenant, agent)
    operator = Actor.for_user(alice)
    before = _state(run)
    # Undoing do_1 and do_2 while do_3 may still land would undo in the wrong order (or not at all).
    with pytest.raises(errors.Conflict) as refused:
        unwind_start(item=item, actor=operator, reason="undo it all")
    assert refused.value.code == "outcome_unknown"
    assert refused.value.details["unknown_action_ids"] == [slow.pk]
    assert "rel.do_3 (#3) is still running" in refused.value.message
    assert "cancel the run" in refused.value.message
    assert _state(run) == before and not Unwind.objects.exists()

    # The way out: cancel (the agent stops; do_3 becomes unknown), confirm it, then compensate.
    run_cancel(run=run, actor=operator, reason="the agent is stuck")
    assert Action.objects.get(pk=slow.pk).status == Action.Status.UNKNOWN
    moves.action_reconcile(action=slow, actor=operator, happened=True, reason="thing-3 exists")
    unwind = unwind_start(item=RecoveryItem.objects.get(pk=item.pk), actor=operator, reason="undo")
    assert [s.action.tool for s in unwind.steps.order_by("position")] == ["rel.do_3", "rel.do_2", "rel.do_1"]


def test_a_failure_with_an_action_still_running_is_not_compensated_automatically(tenant, agent):
    load_onboarding_policies(auto_compensate="high")
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")
    perform_action(run, agent, "hr.create_user", target_id="ashu", args={"email": "ashu@company.com"})
    slow = record(run, agent, "slow", tool="workspace.provision_license", args={"email": "ashu@company.com"})
    moves.action_start(action=slow, actor=agent)

    outcome = run_fail_and_queue(run=run, actor=agent, error="gave up")

    assert outcome.unwind is None and not Unwind.objects.exists()
    assert (outcome.item.status, Run.objects.get(pk=run.pk).status) == ("open", "failed")


def test_a_run_that_starts_compensating_leaves_no_action_running(tenant, agent, alice):
    # Every path into compensating, not only the operator's (which refuses first): the agent
    # cannot report any more, so the action's outcome becomes unknown in the same transaction.
    run, slow, _item = _failed_with_a_running_action(tenant, agent)
    runs.run_compensation_started(run=run, actor=Actor.for_user(alice), reason="undo")
    assert Action.objects.get(pk=slow.pk).status == Action.Status.UNKNOWN
    event = Event.objects.get(run=run, kind="action.outcome_unknown", subject_id=slow.pk)
    assert event.reason == "run started compensating while the action was running"


# --- The API ---------------------------------------------------------------------------------


@pytest.fixture
def operator_api(operator_key) -> Api:
    return Api(operator_key[1])


@pytest.fixture
def agent_api(agent_key) -> Api:
    return Api(agent_key[1])


def _agent_run(agent_api: Api) -> tuple[str, str]:
    """A run the agent made over HTTP, with one action running."""
    load_onboarding_policies()
    run = agent_api.post("/runs", {"agent": "onboarding", "request": "Onboard Ashu Kumar"}).json()
    action = agent_api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "hr.create_user", "idempotency_key": "hr-ashu", "args": {"email": "ashu@company.com"}},
    ).json()
    assert agent_api.post(f"/actions/{action['id']}/start").status_code == 200
    return run["id"], action["id"]


def test_an_operator_cancels_over_the_api_and_the_agent_hears_of_it(operator_api, agent_api):
    run_id, action_id = _agent_run(agent_api)

    response = operator_api.post(f"/runs/{run_id}/cancel", {"reason": "the user withdrew the request"})

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["status"]) == (run_id, "cancelled")
    assert body["unknown_action_ids"] == [action_id]
    assert body["command"]["kind"] == "cancel" and body["command"]["status"] == "pending"
    assert body["recovery_item"]["reason"] == "cancelled"
    # The agent's next write is refused, naming the state ...
    late = agent_api.post(
        f"/runs/{run_id}/actions", {"tool": "email.send_welcome", "idempotency_key": "welcome", "args": {}}
    )
    assert late.status_code == 409
    assert error_of(late)["code"] == "run_not_accepting_actions"
    assert error_of(late)["details"]["current"] == "cancelled"
    finished = agent_api.post(f"/actions/{action_id}/succeed", {"result": {"ok": True}})
    assert finished.status_code == 409 and error_of(finished)["code"] == "run_not_accepting_actions"
    # ... and its heartbeat and command poll carry the cancel.
    heartbeat = agent_api.post(f"/runs/{run_id}/heartbeat", {}).json()
    assert [(c["kind"], c["reason"]) for c in heartbeat["commands"]] == [
        ("cancel", "the user withdrew the request")
    ]
    assert [c["kind"] for c in agent_api.get(f"/runs/{run_id}/commands").json()["commands"]] == ["cancel"]


def test_a_cancel_retried_with_its_idempotency_key_is_replayed(operator_api, agent_api):
    run_id, _action_id = _agent_run(agent_api)
    headers = {"Idempotency-Key": "cancel-ashu-1"}
    first = operator_api.post(f"/runs/{run_id}/cancel", {"reason": "withdrawn"}, headers=headers)
    again = operator_api.post(f"/runs/{run_id}/cancel", {"reason": "withdrawn"}, headers=headers)
    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert AgentCommand.objects.filter(run_id=run_id).count() == 1
    # Without the key, a second cancel is a conflict naming the state.
    plain = operator_api.post(f"/runs/{run_id}/cancel", {"reason": "withdrawn"})
    assert plain.status_code == 409 and error_of(plain)["details"]["current"] == "cancelled"


def test_cancelling_a_closed_run_is_a_conflict_and_is_audited(operator_api, tenant, agent):
    run = force_status(runs.run_create(tenant=tenant, actor=agent, agent="a", request="r"), "closed")
    for headers in ({}, {"Idempotency-Key": "cancel-closed"}):
        response = operator_api.post(f"/runs/{run.pk}/cancel", {"reason": "stop"}, headers=headers)
        assert response.status_code == 409
        error = error_of(response)
        assert (error["code"], error["details"]["current"]) == ("invalid_transition", "closed")
    assert Run.objects.get(pk=run.pk).status == "closed" and not AgentCommand.objects.exists()
    # Both refusals are audited, the one made with a key too (its own transaction rolled back).
    assert Event.objects.filter(run=run, kind="decision.refused", actor_label="supervisor").count() == 2


def test_cancel_needs_the_operator_scope_a_reason_and_a_run_of_the_tenant(
    operator_api, agent_api, outsider_key, tenant, agent
):
    run_id, _action_id = _agent_run(agent_api)
    assert agent_api.post(f"/runs/{run_id}/cancel", {"reason": "me"}).status_code == 403
    assert Api(outsider_key[1]).post(f"/runs/{run_id}/cancel", {"reason": "mine"}).status_code == 404
    assert operator_api.post("/runs/run_nope/cancel", {"reason": "x"}).status_code == 404
    for body in ({}, {"reason": ""}, {"reason": "x", "force": True}):
        response = operator_api.post(f"/runs/{run_id}/cancel", body)
        assert response.status_code == 422 and error_of(response)["code"] == "invalid_request"
    blank = operator_api.post(f"/runs/{run_id}/cancel", {"reason": "   "})
    assert blank.status_code == 422
    assert Run.objects.get(pk=run_id).status == "running"
    assert not AgentCommand.objects.exists()
    assert Client().post(f"/api/v1/runs/{run_id}/cancel").status_code == 401


# --- The dashboard ---------------------------------------------------------------------------


def test_the_dashboard_confirms_then_cancels_and_explains_a_refusal(run, alice, carol):
    client = Client()
    client.force_login(alice)
    url = f"/runs/{run.pk}/cancel"

    preview = client.get(url)
    assert preview.status_code == 200
    page = preview.content.decode()
    assert "1 running action becomes" in page and "1 succeeded action stays as it is" in page
    assert Run.objects.get(pk=run.pk).status == "running"  # a GET decides nothing

    blank = client.post(url, {"reason": " "})
    assert blank.status_code == 422 and "reason" in blank.content.decode().lower()
    assert Run.objects.get(pk=run.pk).status == "running"

    done = client.post(url, {"reason": "the user withdrew"}, follow=True)
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    assert "Run cancelled" in done.content.decode()

    again = client.post(url, {"reason": "twice"}, follow=True)
    assert "only a running or failed run can be cancelled" in again.content.decode()
    assert AgentCommand.objects.filter(run=run).count() == 1

    viewer = Client()
    viewer.force_login(carol)
    assert viewer.get(url).status_code == 403
