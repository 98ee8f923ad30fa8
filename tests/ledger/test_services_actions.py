"""Every action transition and every refused one; runs that no longer accept actions; pivot
order; checkpoints."""

from __future__ import annotations

import functools

import pytest

from infra import errors
from ledger import selectors
from ledger.audit import Actor
from ledger.models import Action, Checkpoint, Event, Run
from ledger.services import checkpoints, runs
from ledger.services.actions import moves
from tests.factories import auto_policy, force_status, make_run, record, refused

ALL_ACTION_STATES = list(Action.Status.values)


@pytest.fixture
def run(tenant, agent):
    auto_policy("hr.*")
    return make_run(tenant, agent)


def _last_event(action: Action) -> tuple[str, str, str]:
    return (
        Event.objects.filter(subject_id=action.pk)
        .order_by("-id")
        .values_list("kind", "from_state", "to_state")[0]
    )


def test_it_runs_an_action_from_planned_to_succeeded(run, agent):
    action = record(run, agent, "k1", before_snapshot={"exists": False})
    assert (action.status, action.requires_approval, action.risk) == ("planned", False, "low")
    moves.action_start(action=action, actor=agent)
    action.refresh_from_db()
    assert (action.status, action.attempts) == ("running", 1)
    assert action.started_at is not None
    moves.action_succeed(action=action, actor=agent, result={"user_id": 7}, after_snapshot={"exists": True})
    action.refresh_from_db()
    assert (action.status, action.result, action.after_snapshot, action.completion_seq) == (
        "succeeded",
        {"user_id": 7},
        {"exists": True},
        1,
    )
    assert Run.objects.get(pk=run.pk).completion_count == 1
    assert _last_event(action) == ("action.succeeded", "running", "succeeded")


def test_it_numbers_completions_in_the_order_actions_finish(run, agent):
    # LIFO compensation follows completion order, not recording order.
    first, second = record(run, agent, "a"), record(run, agent, "b")
    for action in (first, second):
        moves.action_start(action=action, actor=agent)
    moves.action_succeed(action=second, actor=agent)
    moves.action_succeed(action=first, actor=agent)
    assert Action.objects.get(pk=second.pk).completion_seq == 1
    assert Action.objects.get(pk=first.pk).completion_seq == 2


def test_it_fails_a_running_action_and_retries_it_with_the_same_key(run, agent):
    action = record(run, agent, "k1")
    moves.action_start(action=action, actor=agent)
    moves.action_fail(action=action, actor=agent, error="503 from HR", retryable=True, layer="tool")
    action.refresh_from_db()
    assert (action.status, action.error, action.retryable, action.error_layer) == (
        "failed",
        "503 from HR",
        True,
        "tool",
    )
    assert _last_event(action) == ("action.failed", "running", "failed")
    moves.action_start(action=action, actor=agent)
    action.refresh_from_db()
    assert (action.status, action.attempts, action.error) == ("running", 2, "")


def test_it_marks_a_timed_out_action_unknown_and_reconciles_it_either_way(run, agent, alice):
    happened, did_not = record(run, agent, "a"), record(run, agent, "b")
    for action in (happened, did_not):
        moves.action_start(action=action, actor=agent)
        moves.action_fail(
            action=action, actor=agent, error="timeout", retryable=True, layer="tool", outcome_unknown=True
        )
        assert Action.objects.get(pk=action.pk).status == "unknown"
    operator = Actor.for_user(alice)
    moves.action_reconcile(
        action=happened, actor=operator, happened=True, reason="user exists in HR", result={"user_id": 9}
    )
    moves.action_reconcile(action=did_not, actor=operator, happened=False, reason="no such user in HR")
    happened.refresh_from_db()
    did_not.refresh_from_db()
    assert (happened.status, happened.result, happened.completion_seq) == ("succeeded", {"user_id": 9}, 1)
    assert did_not.status == "failed" and did_not.retryable is True
    assert _last_event(happened) == ("action.reconciled", "unknown", "succeeded")
    assert _last_event(did_not) == ("action.reconciled", "unknown", "failed")


def test_it_refuses_to_reconcile_without_a_reason(run, agent):
    action = force_status(record(run, agent, "k1"), "unknown")
    with refused(action, current="unknown", error=errors.ValidationFailed):
        moves.action_reconcile(action=action, actor=agent, happened=True, reason=" ")


def test_it_takes_a_gated_action_through_approval(tenant, agent, bob):
    run = make_run(tenant, agent)
    action = record(run, agent, "k1", tool="payments.charge")  # unknown tool: built-in default
    assert action.requires_approval and action.risk == "high"
    with refused(action, current="planned", error=errors.ApprovalPending):
        moves.action_start(action=action, actor=agent)
    moves.action_await_approval(action=action, actor=agent)
    with refused(action, current="awaiting_approval", error=errors.ApprovalPending):
        moves.action_start(action=action, actor=agent)
    moves.action_approve(action=action, actor=Actor.for_user(bob), reason="ok", args={"amount": 10})
    action.refresh_from_db()
    assert (action.status, action.args) == ("approved", {"amount": 10})
    moves.action_start(action=action, actor=agent)
    assert Action.objects.get(pk=action.pk).status == "running"


def test_it_rejects_a_gated_action_and_refuses_to_start_it(tenant, agent, bob):
    run = make_run(tenant, agent)
    action = record(run, agent, "k1", tool="payments.charge")
    moves.action_await_approval(action=action, actor=agent)
    moves.action_reject(action=action, actor=Actor.for_user(bob), reason="wrong amount")
    action.refresh_from_db()
    assert (action.status, action.error) == ("rejected", "wrong amount")
    with refused(action, current="rejected", error=errors.ApprovalRejected):
        moves.action_start(action=action, actor=agent)


def test_it_compensates_a_succeeded_action(run, agent):
    action = force_status(record(run, agent, "k1"), "succeeded")
    moves.action_compensation_started(action=action, actor=Actor.system("unwind"), step_id="stp_1")
    assert Action.objects.get(pk=action.pk).status == "compensating"
    moves.action_compensation_finished(
        action=action, actor=Actor.system("unwind"), outcome="done", step_id="stp_1", state={"exists": False}
    )
    assert Action.objects.get(pk=action.pk).status == "compensated"
    assert _last_event(action) == ("action.compensation_done", "compensating", "compensated")


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("failed", "compensation_failed"),
        ("drifted", "compensation_failed"),
        ("skipped", "succeeded"),
    ],
)
def test_it_finishes_a_compensation_with_each_outcome(run, agent, outcome, expected):
    action = force_status(record(run, agent, "k1"), "compensating")
    moves.action_compensation_finished(
        action=action, actor=Actor.system("unwind"), outcome=outcome, step_id="s"
    )
    assert Action.objects.get(pk=action.pk).status == expected


def test_it_retries_a_failed_compensation(run, agent):
    action = force_status(record(run, agent, "k1"), "compensation_failed")
    moves.action_compensation_started(action=action, actor=Actor.system("unwind"), step_id="stp_2")
    assert Action.objects.get(pk=action.pk).status == "compensating"


def test_it_refuses_an_unknown_compensation_outcome(run, agent):
    action = force_status(record(run, agent, "k1"), "compensating")
    with refused(action, current="compensating", error=errors.ValidationFailed):
        moves.action_compensation_finished(action=action, actor=agent, outcome="exploded", step_id="s")


def test_it_refuses_an_unknown_error_layer(run, agent):
    action = force_status(record(run, agent, "k1"), "running")
    with refused(action, current="running", error=errors.ValidationFailed):
        moves.action_fail(action=action, actor=agent, error="x", retryable=False, layer="network")


def _start(action, actor):
    return moves.action_start(action=action, actor=actor)


def _compensation_finished(a: Action, actor: Actor, *, outcome: str) -> Action:
    return moves.action_compensation_finished(action=a, actor=actor, outcome=outcome, step_id="s")


ACTION_SERVICES = {
    "await_approval": (lambda a, actor: moves.action_await_approval(action=a, actor=actor), {"planned"}),
    "approve": (
        lambda a, actor: moves.action_approve(action=a, actor=actor, reason="x"),
        {"awaiting_approval"},
    ),
    "reject": (
        lambda a, actor: moves.action_reject(action=a, actor=actor, reason="x"),
        {"awaiting_approval"},
    ),
    # awaiting_approval and rejected are refused with their own, more helpful errors (above).
    "start": (_start, {"planned", "approved", "failed", "awaiting_approval", "rejected"}),
    "succeed": (lambda a, actor: moves.action_succeed(action=a, actor=actor, result={}), {"running"}),
    "fail": (
        lambda a, actor: moves.action_fail(action=a, actor=actor, error="x", retryable=True, layer="tool"),
        {"running"},
    ),
    "outcome_unknown": (
        lambda a, actor: moves.action_fail(
            action=a, actor=actor, error="x", retryable=True, layer="tool", outcome_unknown=True
        ),
        {"running"},
    ),
    "reconcile_happened": (
        lambda a, actor: moves.action_reconcile(action=a, actor=actor, happened=True, reason="checked"),
        {"unknown"},
    ),
    "reconcile_did_not_happen": (
        lambda a, actor: moves.action_reconcile(action=a, actor=actor, happened=False, reason="checked"),
        {"unknown"},
    ),
    "compensation_started": (
        lambda a, actor: moves.action_compensation_started(action=a, actor=actor, step_id="s"),
        {"succeeded", "compensation_failed"},
    ),
    **{
        f"compensation_{outcome}": (
            functools.partial(_compensation_finished, outcome=outcome),
            {"compensating"},
        )
        for outcome in ("done", "failed", "drifted", "skipped")
    },
}
REFUSED_ACTION_TRANSITIONS = [
    (name, state)
    for name, (_, allowed) in ACTION_SERVICES.items()
    for state in ALL_ACTION_STATES
    if state not in allowed
]


@pytest.mark.parametrize(("transition", "state"), REFUSED_ACTION_TRANSITIONS)
def test_it_refuses_an_action_transition_the_state_machine_does_not_allow(run, agent, transition, state):
    action = force_status(record(run, agent, "k1"), state)
    call, _ = ACTION_SERVICES[transition]
    with refused(action, current=state):
        call(action, agent)


@pytest.mark.parametrize(
    ("transition", "state"),
    [
        (name, state)
        for name, (_, allowed) in ACTION_SERVICES.items()
        for state in sorted(allowed)
        if state not in ("awaiting_approval", "rejected") or name != "start"
    ],
)
def test_it_allows_each_action_transition_from_each_allowed_state(run, agent, transition, state):
    action = force_status(record(run, agent, "k1"), state)
    call, _ = ACTION_SERVICES[transition]
    call(action, agent)
    assert Event.objects.filter(subject_id=action.pk, from_state=state).count() == 1


def test_it_verifies_a_completed_action_and_records_a_mismatch(run, agent):
    action = force_status(record(run, agent, "k1"), "succeeded")
    moves.action_verify(
        action=action, actor=agent, ok=False, expected={"seats": 1}, actual={"seats": 2}, reason="two seats"
    )
    action.refresh_from_db()
    assert action.verified is False and action.verification["actual"] == {"seats": 2}
    assert _last_event(action)[0] == "action.verification_failed"


def test_it_refuses_to_verify_from_the_rows_state_not_a_stale_copy(run, agent):
    action = force_status(record(run, agent, "k1"), "succeeded")
    stale = Action.objects.get(pk=action.pk)
    force_status(action, "compensated")
    with refused(stale, current="compensated"):
        moves.action_verify(action=stale, actor=agent, ok=True)


@pytest.mark.parametrize("closed", ["failed", "cancelled", "compensating", "compensated", "closed"])
def test_it_refuses_new_actions_on_a_run_that_no_longer_accepts_them(run, agent, closed):
    planned = record(run, agent, "before")
    force_status(run, closed)
    recorded = Action.objects.count()
    with refused(run, current=closed, error=errors.RunNotAcceptingActions):
        record(run, agent, "late")
    # The error names the run's state, which is what refuses the start.
    with refused(planned, current=closed, error=errors.RunNotAcceptingActions):
        moves.action_start(action=planned, actor=agent)
    assert Action.objects.count() == recorded


def test_it_accepts_actions_again_once_a_failed_run_is_resumed(run, agent, alice):
    force_status(run, "failed")
    runs.run_resume(run=run, actor=Actor.for_user(alice), reason="the tool is fixed")
    assert record(run, agent, "retry-step").status == "planned"


@pytest.mark.parametrize("outcome", ["succeed", "fail"])
def test_it_takes_the_late_report_of_an_action_that_was_running_when_its_run_failed(run, agent, outcome):
    # The truth arriving late: the run failed (its agent gave up, or was presumed lost) while the
    # call was under way; how that call ended is still recorded, for the decision that follows.
    action = record(run, agent, "slow-call")
    moves.action_start(action=action, actor=agent)
    force_status(run, "failed")
    if outcome == "succeed":
        moves.action_succeed(action=action, actor=agent, result={"ok": True})
    else:
        moves.action_fail(action=action, actor=agent, error="boom", retryable=False, layer="tool")
    assert Action.objects.get(pk=action.pk).status == ("succeeded" if outcome == "succeed" else "failed")


@pytest.mark.parametrize("closed", ["cancelled", "compensating", "compensated", "closed"])
def test_it_refuses_the_late_report_once_the_run_left_the_agents_hands(run, agent, closed):
    action = record(run, agent, "slow-call")
    moves.action_start(action=action, actor=agent)
    force_status(run, closed)
    with refused(action, current=closed, error=errors.RunNotAcceptingActions):
        moves.action_succeed(action=action, actor=agent, result={"ok": True})
    with refused(action, current=closed, error=errors.RunNotAcceptingActions):
        moves.action_fail(action=action, actor=agent, error="boom", retryable=False, layer="tool")


def test_it_warns_when_a_compensatable_action_follows_the_irreversible_pivot(tenant, agent):
    auto_policy("hr.*")
    auto_policy("email.send", action_class="external_irreversible", compensation="correction")
    run = make_run(tenant, agent)
    assert record(run, agent, "a", tool="hr.create_user").warnings == []
    pivot = record(run, agent, "b", tool="email.send")
    late = record(run, agent, "c", tool="hr.update_user")
    assert [w["code"] for w in late.warnings] == ["pivot_order"]
    assert late.warnings[0]["pivot_action_id"] == pivot.pk
    assert [w["code"] for w in selectors.run_warnings(run=run)] == ["pivot_order"]


def test_it_does_not_count_a_rejected_pivot(tenant, agent, bob):
    auto_policy("hr.*")
    run = make_run(tenant, agent)
    pivot = record(run, agent, "b", tool="payments.charge")  # unknown → irreversible by default
    moves.action_await_approval(action=pivot, actor=agent)
    moves.action_reject(action=pivot, actor=Actor.for_user(bob), reason="no")
    assert record(run, agent, "c", tool="hr.update_user").warnings == []
    assert selectors.run_warnings(run=run) == []


def test_it_warns_about_an_irreversible_action_without_a_correction(tenant, agent):
    run = make_run(tenant, agent)
    action = record(run, agent, "k", tool="github.delete_repository")
    # No policy names it: the default (irreversible) applied, and both are said.
    assert [w["code"] for w in action.warnings] == ["default_policy", "irreversible_without_correction"]


def test_it_writes_a_checkpoint_referencing_the_runs_actions(run, agent):
    done, todo = record(run, agent, "a"), record(run, agent, "b")
    moves.action_start(action=done, actor=agent)
    moves.action_succeed(action=done, actor=agent)
    checkpoint = checkpoints.checkpoint_write(
        run=run,
        actor=agent,
        name="after-hr",
        state={"step": 2},
        completed_action_ids=[done.pk],
        pending_action_ids=[todo.pk],
        recovery_mode="resume_only",
        summary="HR account exists",
    )
    assert (checkpoint.completion_mark, checkpoint.recovery_mode) == (1, "resume_only")
    assert selectors.checkpoint_latest(run=run) == checkpoint
    assert Event.objects.filter(subject_id=str(checkpoint.pk), kind="checkpoint.written").exists()


def test_it_refuses_a_checkpoint_naming_unknown_actions(tenant, run, agent):
    other_run = make_run(tenant, agent)
    foreign = record(other_run, agent, "foreign")
    events = Event.objects.count()
    with pytest.raises(errors.ValidationFailed) as excinfo:
        checkpoints.checkpoint_write(
            run=run, actor=agent, name="cp", completed_action_ids=["act_nope", foreign.pk]
        )
    assert excinfo.value.status == 422
    assert excinfo.value.details == {"unknown_action_ids": sorted(["act_nope", foreign.pk])}
    assert Checkpoint.objects.count() == 0 and Event.objects.count() == events


def test_it_refuses_a_checkpoint_with_an_unknown_recovery_mode(run, agent):
    with pytest.raises(errors.ValidationFailed):
        checkpoints.checkpoint_write(run=run, actor=agent, name="cp", recovery_mode="yolo")
    assert Checkpoint.objects.count() == 0


# The same rule as recording an action (Run.CLOSED_TO_WRITES): compensating included.
@pytest.mark.parametrize("closed", ["failed", "cancelled", "compensating", "compensated", "closed"])
def test_it_refuses_checkpoints_on_a_run_closed_to_writes(run, agent, closed):
    force_status(run, closed)
    with refused(run, current=closed, error=errors.RunNotAcceptingActions):
        checkpoints.checkpoint_write(run=run, actor=agent, name="cp")
