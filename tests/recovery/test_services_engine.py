"""Engine rules driven in-process (no worker): planner, fencing, sweeper, approvals, resume,
close, bulk decisions, lost agents, and the race between two Compensate clicks."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Event, Run
from ledger.services import checkpoints, runs
from ledger.services.actions import moves
from recovery import compensators, planner, selectors, sweeper
from recovery.actions import commands
from recovery.actions.approvals import action_record_gated, approval_approve, approval_reject
from recovery.actions.bulk import items_bulk_close
from recovery.actions.compensations import step_retry, unwind_start, unwind_stop
from recovery.actions.periodic import agents_detect_lost, approvals_expire
from recovery.actions.reports import action_fail_and_queue, run_fail_and_queue
from recovery.actions.resolutions import item_close, item_resume
from recovery.models import AgentCommand, Approval, RecoveryItem, Unwind, UnwindStep
from recovery.transitions import items
from recovery.unwinds.advance import unwind_advance_move
from recovery.unwinds.claim import step_claim
from recovery.unwinds.runner import step_record_outcome
from tests.factories import load_onboarding_policies, onboarding_saga


def test_the_plan_is_lifo_by_completion_and_flags_what_needs_a_human(tenant, agent):
    load_onboarding_policies(license_risk="high")
    saga = onboarding_saga(tenant, agent, fail_run=False)
    plan = planner.compensation_plan(run=saga.run)

    assert [s.action.tool for s in plan.steps] == ["workspace.provision_license", "hr.create_user"]
    license_step, user_step = plan.steps
    assert (license_step.tool, license_step.args) == (
        "workspace.cancel_license",
        {"email": "ashu@company.com"},
    )
    assert license_step.requires_approval and license_step.risk == "high"
    assert not user_step.requires_approval
    # No compensator is registered in this test: the preview says the step would fail.
    assert "no compensator is registered" in user_step.note
    as_dict = plan.as_dict()
    assert as_dict["needs_approval"] == 1 and as_dict["steps"][0]["action_id"] == saga.provision_license.pk


def test_the_plan_follows_completion_order_not_recording_order_and_warns(tenant, agent):
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="a", request="r")
    first = action_record_gated(
        run=run,
        actor=agent,
        tool="hr.create_user",
        idempotency_key="x1",
        compensation={"tool": "hr.delete_user", "args": {}},
    ).action
    second = action_record_gated(
        run=run,
        actor=agent,
        tool="workspace.provision_license",
        idempotency_key="x2",
        compensation={"tool": "workspace.cancel_license", "args": {}},
    ).action
    irreversible = action_record_gated(
        run=run, actor=agent, tool="email.send_welcome", idempotency_key="x3"
    ).action
    unknown = action_record_gated(
        run=run,
        actor=agent,
        tool="hr.create_user",
        idempotency_key="x4",
        compensation={"tool": "hr.delete_user", "args": {}},
    ).action
    for action in (first, second, irreversible, unknown):
        moves.action_start(action=action, actor=agent)
    # Recorded 1, 2, 3; completed 2, 3, 1: LIFO follows completion.
    moves.action_succeed(action=second, actor=agent)
    moves.action_succeed(action=irreversible, actor=agent)
    moves.action_succeed(action=first, actor=agent)
    moves.action_fail(
        action=unknown, actor=agent, error="timeout", retryable=True, layer="tool", outcome_unknown=True
    )

    plan = planner.compensation_plan(run=run)
    assert [s.action.pk for s in plan.steps] == [first.pk, irreversible.pk, second.pk]
    assert not plan.steps[1].can_undo and "cannot be undone" in plan.steps[1].note
    codes = {w["code"] for w in plan.warnings}
    assert {"outcome_unknown", "cannot_undo", "pivot_order"} <= codes
    assert plan.unknown_actions == [unknown.pk]


def test_compensate_is_refused_while_an_outcome_is_unknown(tenant, agent, alice):
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent, fail_run=False)
    action = action_record_gated(
        run=saga.run,
        actor=agent,
        tool="hr.create_user",
        idempotency_key="u1",
        compensation={"tool": "hr.delete_user", "args": {}},
    ).action
    moves.action_start(action=action, actor=agent)
    action_fail_and_queue(
        action=action, actor=agent, error="timeout", retryable=True, layer="tool", outcome_unknown=True
    )
    outcome = run_fail_and_queue(run=saga.run, actor=agent, error="gave up")
    with pytest.raises(errors.Conflict) as refused:
        unwind_start(item=outcome.item, actor=Actor.for_user(alice), reason="undo")
    assert refused.value.code == "outcome_unknown"
    assert RecoveryItem.objects.get(pk=outcome.item.pk).status == RecoveryItem.Status.OPEN  # rolled back


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_compensate_requests_produce_one_unwind(tenant, agent, alice, bob):
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent)
    barrier = threading.Barrier(2)
    results: list[object] = []

    def click(user):
        try:
            barrier.wait()
            results.append(unwind_start(item=saga.item, actor=Actor.for_user(user), reason="undo"))
        except errors.InvalidTransition as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=click, args=(u,)) for u in (alice, bob)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)

    unwinds_made = [r for r in results if isinstance(r, Unwind)]
    refusals = [r for r in results if isinstance(r, errors.InvalidTransition)]
    assert len(unwinds_made) == 1 and len(refusals) == 1
    assert refusals[0].current == RecoveryItem.Status.CLAIMED
    assert Unwind.objects.filter(run=saga.run).count() == 1
    assert UnwindStep.objects.filter(unwind__run=saga.run).count() == 2


def _claimed_first_step(saga, alice):
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    step = unwind.steps.get(position=0)
    assert step.status == UnwindStep.Status.QUEUED
    claim = step_claim(step_id=step.pk)
    assert claim is not None
    return unwind, step, claim


def test_a_worker_that_lost_its_lease_cannot_record_an_outcome(tenant, agent, alice):
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent)
    unwind, step, stale_claim = _claimed_first_step(saga, alice)
    # A second claim of a running step is impossible: the step is not queued any more.
    assert step_claim(step_id=step.pk) is None

    UnwindStep.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    report = sweeper.sweep()
    assert report.leases_expired == 1
    step.refresh_from_db()
    assert step.status == UnwindStep.Status.QUEUED and "Lease expired" in step.error

    fresh_claim = step_claim(step_id=step.pk)
    assert fresh_claim.token == stale_claim.token + 1
    assert fresh_claim.request.idempotency_key == stale_claim.request.idempotency_key
    # The presumed-dead worker wakes up and reports: fenced off.
    assert (
        step_record_outcome(
            step_id=step.pk, token=stale_claim.token, outcome=compensators.Outcome.failed("late")
        )
        is None
    )
    assert (
        step_record_outcome(
            step_id=step.pk, token=fresh_claim.token, outcome=compensators.Outcome.done({"ok": 1})
        )
        is not None
    )
    step.refresh_from_db()
    assert (step.status, step.result, step.attempts) == ("done", {"ok": 1}, 2)


def test_a_step_out_of_attempts_fails_and_the_run_ends_with_an_item_listing_what_is_left(
    tenant, agent, alice
):
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent)
    unwind, step, claim = _claimed_first_step(saga, alice)
    UnwindStep.objects.filter(pk=step.pk).update(max_attempts=1)
    step_record_outcome(step_id=step.pk, token=claim.token, outcome=compensators.Outcome.retry("503"))
    step.refresh_from_db()
    assert step.status == UnwindStep.Status.FAILED and step.error.startswith("Gave up after 1 attempts")

    # alert_and_continue: the next step still runs.
    unwind_advance_move(unwind_id=unwind.pk)
    second = unwind.steps.get(position=1)
    claim2 = step_claim(step_id=second.pk)
    step_record_outcome(step_id=second.pk, token=claim2.token, outcome=compensators.Outcome.done())
    unwind_advance_move(unwind_id=unwind.pk)

    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.FAILED
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.FAILED
    item = RecoveryItem.objects.get(run=saga.run, status="open")
    assert item.reason == RecoveryItem.Reason.COMPENSATION_FAILED
    assert [e["tool"] for e in item.details["left"]] == ["workspace.cancel_license"]

    # Retry by the operator: the run goes back to compensating and the step runs again.
    step_retry(step=step, actor=Actor.for_user(alice), reason="license API is back")
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATING
    unwind_advance_move(unwind_id=unwind.pk)
    claim3 = step_claim(step_id=step.pk)
    step_record_outcome(step_id=step.pk, token=claim3.token, outcome=compensators.Outcome.done())
    unwind_advance_move(unwind_id=unwind.pk)
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATED
    assert RecoveryItem.objects.get(pk=item.pk).resolution == "compensated"


def test_halt_stops_the_unwind_at_the_first_failure(tenant, agent, alice):
    load_onboarding_policies()
    from ledger.models import PolicySet

    # As load_policies stores it: the loader normalises the file's "HALT" (tested there), and
    # the engine reads the stored value as it is.
    PolicySet.objects.filter(tenant=None).update(unwind={"on_compensation_failure": "halt"})
    saga = onboarding_saga(tenant, agent)
    unwind, step, claim = _claimed_first_step(saga, alice)
    assert unwind.on_failure == Unwind.OnFailure.HALT
    step_record_outcome(step_id=step.pk, token=claim.token, outcome=compensators.Outcome.failed("400"))
    unwind_advance_move(unwind_id=unwind.pk)
    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.FAILED
    assert unwind.steps.get(position=1).status == UnwindStep.Status.PENDING
    left = RecoveryItem.objects.get(run=saga.run, status="open").details["left"]
    assert [(e["tool"], e["status"]) for e in left] == [
        ("workspace.cancel_license", "failed"),
        ("hr.delete_user", "pending"),
    ]


def _gated_unwind(tenant, agent, alice):
    load_onboarding_policies(license_risk="critical")
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    approval = Approval.objects.get(step__unwind=unwind)
    return saga, unwind, approval


def test_an_unanswered_compensation_approval_expires_and_the_step_fails(tenant, agent, alice):
    saga, unwind, approval = _gated_unwind(tenant, agent, alice)
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.PAUSED
    assert approval.expires_at > timezone.now() + timedelta(hours=23)

    assert approvals_expire(now=approval.expires_at + timedelta(seconds=1)) == 1
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED
    step = approval.step
    step.refresh_from_db()
    assert step.status == UnwindStep.Status.FAILED and "expired" in step.error
    # The forward action was never touched.
    assert Action.objects.get(pk=saga.provision_license.pk).status == Action.Status.SUCCEEDED
    # A refused approval cannot be retried into running: a new compensation must ask again.
    with pytest.raises(errors.Conflict):
        step_retry(step=step, actor=Actor.for_user(alice), reason="try again")


def test_the_requester_cannot_approve_a_compensation_step(tenant, agent, alice, bob):
    saga, unwind, approval = _gated_unwind(tenant, agent, alice)
    with pytest.raises(errors.SelfApproval):
        approval_approve(approval=approval, actor=Actor.for_user(alice), reason="mine")
    approval_approve(approval=approval, actor=Actor.for_user(bob), reason="ok")
    step = UnwindStep.objects.get(pk=approval.step_id)
    assert step.status == UnwindStep.Status.QUEUED
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.RUNNING


def test_a_rejected_compensation_step_is_left_and_reported(tenant, agent, alice, bob):
    saga, unwind, approval = _gated_unwind(tenant, agent, alice)
    approval_reject(approval=approval, actor=Actor.for_user(bob), reason="license must stay")
    step = UnwindStep.objects.get(pk=approval.step_id)
    assert step.status == UnwindStep.Status.FAILED and "license must stay" in step.error


def test_resume_from_a_stale_checkpoint_shows_the_warning_then_issues_the_command(tenant, agent, alice):
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard")
    user = action_record_gated(run=run, actor=agent, tool="hr.create_user", idempotency_key="s1").action
    moves.action_start(action=user, actor=agent)
    moves.action_succeed(action=user, actor=agent)
    checkpoint = checkpoints.checkpoint_write(
        run=run, actor=agent, name="user-created", completed_action_ids=[user.pk]
    )
    welcome = action_record_gated(
        run=run, actor=agent, tool="email.send_welcome", idempotency_key="s2"
    ).action
    moves.action_start(action=welcome, actor=agent)
    moves.action_succeed(action=welcome, actor=agent)
    item = run_fail_and_queue(run=run, actor=agent, error="crashed after the e-mail").item

    preview = selectors.resume_preview(item=item)
    assert preview.checkpoint == checkpoint and preview.stale
    assert [a.pk for a in preview.succeeded_after] == [welcome.pk]
    assert [a.pk for a in preview.repeats] == [welcome.pk]  # the e-mail would be sent twice
    assert {"stale_checkpoint", "repeats_non_idempotent"} <= {w["code"] for w in preview.warnings}

    command = item_resume(item=item, actor=Actor.for_user(alice), reason="agent fixed", checkpoint=checkpoint)
    assert (command.kind, command.checkpoint, command.status) == ("resume", checkpoint, "pending")
    item.refresh_from_db()
    assert (item.status, item.resolution) == ("resolved", "resumed")
    assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    assert list(selectors.commands_pending(run=run)) == [command]


def test_close_requires_a_reason_and_closes_the_failed_run(tenant, agent, alice):
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent)
    with pytest.raises(errors.ValidationFailed):
        item_close(item=saga.item, actor=Actor.for_user(alice), reason="  ")
    item_close(item=saga.item, actor=Actor.for_user(alice), reason="handled by hand in HR")
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.CLOSED
    item = RecoveryItem.objects.get(pk=saga.item.pk)
    assert (item.status, item.resolution, item.resolved_by) == ("resolved", "closed", alice)
    with pytest.raises(errors.InvalidTransition):
        unwind_start(item=item, actor=Actor.for_user(alice), reason="too late")


def test_bulk_close_handles_low_risk_items_only_and_caps_the_selection(tenant, agent, alice, settings):
    items = []
    for n in range(3):
        run = runs.run_create(tenant=tenant, actor=agent, agent="a", request=f"r{n}")
        items.append(run_fail_and_queue(run=run, actor=agent, error="boom").item)
    RecoveryItem.objects.filter(pk=items[2].pk).update(risk="high")
    items[2].refresh_from_db()

    outcomes = items_bulk_close(items=items, actor=Actor.for_user(alice), reason="test noise")
    assert [(o.ok, o.code) for o in outcomes] == [(True, ""), (True, ""), (False, "risk_too_high")]
    assert RecoveryItem.objects.filter(status="resolved").count() == 2

    settings.SAGA = {**settings.SAGA, "BULK_MAX_ITEMS": 1}
    with pytest.raises(errors.ValidationFailed):
        items_bulk_close(items=items, actor=Actor.for_user(alice), reason="too many")


def test_a_run_without_heartbeats_is_failed_as_agent_lost(tenant, agent, settings):
    run = runs.run_create(tenant=tenant, actor=agent, agent="a", request="r")
    Run.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=10))
    alive = runs.run_create(tenant=tenant, actor=agent, agent="a", request="still here")

    assert agents_detect_lost() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    item = RecoveryItem.objects.get(run=run)
    assert item.reason == RecoveryItem.Reason.AGENT_LOST and "No heartbeat" in item.error
    assert Run.objects.get(pk=alive.pk).status == Run.Status.RUNNING


def test_an_undelivered_resume_command_is_pushed_again(
    tenant, agent, alice, django_capture_on_commit_callbacks, settings
):
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1:9"]}
    run = runs.run_create(
        tenant=tenant, actor=agent, agent="a", request="r", resume_url="http://127.0.0.1:9/x"
    )
    item = run_fail_and_queue(run=run, actor=agent, error="boom").item
    command = item_resume(item=item, actor=Actor.for_user(alice), reason="go on")
    AgentCommand.objects.filter(pk=command.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    import django_rq

    with django_capture_on_commit_callbacks(execute=True):
        assert commands.commands_redeliver() == 1
    queued = django_rq.get_queue("notifications").jobs
    assert [job.kwargs for job in queued] == [{"command_id": command.pk}]


def test_every_engine_transition_is_audited(tenant, agent, alice):
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent)
    unwind, step, claim = _claimed_first_step(saga, alice)
    kinds = list(Event.objects.filter(run=saga.run).values_list("kind", flat=True))
    assert {
        "recovery.claimed",
        "run.compensating",
        "unwind.started",
        "step.queued",
        "step.started",
        "action.compensating",
    } <= set(kinds)


def test_whoever_claims_an_unassigned_item_becomes_its_assignee_and_an_assignee_stays(
    tenant, agent, alice, bob
):
    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent)
    unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    item = RecoveryItem.objects.get(pk=saga.item.pk)
    assert (item.status, item.claimed_by, item.assignee) == (RecoveryItem.Status.CLAIMED, alice, alice)

    # Assigned to bob first: alice's claim leaves bob as the assignee.
    other = onboarding_saga(tenant, agent, name="Lee Wong", email="lee@company.com")
    items.item_assign(item=other.item, actor=Actor.for_user(alice), assignee=bob)
    unwind_start(item=other.item, actor=Actor.for_user(alice), reason="undo")
    item = RecoveryItem.objects.get(pk=other.item.pk)
    assert (item.claimed_by, item.assignee) == (alice, bob)


def test_the_trail_lists_what_an_unwind_in_progress_will_still_undo_apart_from_what_it_could_not(
    tenant, agent, alice
):
    from recovery.trail import run_trail

    load_onboarding_policies()
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    trail = run_trail(run=Run.objects.get(pk=saga.run.pk))
    assert trail["not_undone"] == []
    assert [e["tool"] for e in trail["to_undo"]] == ["hr.create_user", "workspace.provision_license"]
    assert "Being undone now" in trail["summary"] and "Not undone" not in trail["summary"]
    # Once the unwind has stopped short, what is left is reported as not undone, with why.
    unwind_stop(unwind=unwind, actor=Actor.for_user(alice), reason="wrong run")
    trail = run_trail(run=Run.objects.get(pk=saga.run.pk))
    assert trail["to_undo"] == [] and len(trail["not_undone"]) == 2


def test_a_run_waiting_for_an_approval_is_not_lost_and_its_silence_counts_from_the_decision(
    tenant, agent, bob, settings
):
    """A framework's human-in-the-loop pause (LangGraph interrupt, the OpenAI Agents SDK's tool
    approval) sends no heartbeats while a person decides: that is waiting, not a lost agent."""
    from tests.factories import gated_run

    run, action, approval = gated_run(tenant, agent)
    long_ago = timezone.now() - timedelta(minutes=10)
    Run.objects.filter(pk=run.pk).update(last_heartbeat_at=long_ago, created_at=long_ago)
    assert agents_detect_lost() == 0

    # Decided just now: the agent has the timeout from the decision to come back.
    Approval.objects.filter(pk=approval.pk).update(status="approved", decided_at=timezone.now())
    assert agents_detect_lost() == 0

    # Decided long ago and silent since: lost.
    Approval.objects.filter(pk=approval.pk).update(decided_at=long_ago)
    assert agents_detect_lost() == 1
    assert Run.objects.get(pk=run.pk).status == Run.Status.FAILED
