"""Every run transition, and every transition the run state machine refuses."""

from __future__ import annotations

import pytest

from infra import errors
from ledger.audit import Actor
from ledger.models import Event, Run
from ledger.services import runs
from tests.factories import force_status, make_run, record, refused

ALL_RUN_STATES = list(Run.Status.values)


def _events(run: Run) -> list[tuple[str, str, str]]:
    return list(Event.objects.filter(run=run).order_by("id").values_list("kind", "from_state", "to_state"))


def test_it_creates_a_running_run_with_an_audit_event(tenant, agent):
    run = make_run(tenant, agent, external_id="ticket-42", metadata={"team": "people"})
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert run.created_by_key == agent.key
    assert run.last_heartbeat_at is not None
    assert _events(run) == [("run.created", "", "running")]


def test_it_completes_a_running_run(tenant, agent):
    run = make_run(tenant, agent)
    runs.run_complete(run=run, actor=agent, summary="Ashu is onboarded")
    run.refresh_from_db()
    assert (run.status, run.summary) == ("succeeded", "Ashu is onboarded")
    assert run.finished_at is not None
    assert _events(run)[-1] == ("run.completed", "running", "succeeded")


def test_it_fails_a_running_run_naming_the_failed_action(tenant, agent):
    run = make_run(tenant, agent)
    action = record(run, agent, "k1")
    runs.run_fail(run=run, actor=agent, error="license API down", failed_action=action)
    run.refresh_from_db()
    assert (run.status, run.error, run.failure_reason, run.failed_action_id) == (
        "failed",
        "license API down",
        "failed",
        action.pk,
    )
    assert _events(run)[-1] == ("run.failed", "running", "failed")


def test_it_fails_a_succeeded_run_when_verification_comes_back_late(tenant, agent):
    run = make_run(tenant, agent)
    runs.run_complete(run=run, actor=agent)
    runs.run_fail(run=run, actor=agent, error="mismatch", reason="verification_failed")
    assert Run.objects.get(pk=run.pk).status == "failed"


def test_it_refuses_a_failed_action_from_another_run(tenant, agent):
    run, other = make_run(tenant, agent), make_run(tenant, agent)
    foreign = record(other, agent, "k-other")
    with refused(run, current="running", error=errors.ValidationFailed):
        runs.run_fail(run=run, actor=agent, error="x", failed_action=foreign)


def test_it_cancels_a_running_run(tenant, agent):
    run = make_run(tenant, agent)
    runs.run_cancel(run=run, actor=agent, reason="user changed their mind")
    assert Run.objects.get(pk=run.pk).status == "cancelled"
    assert _events(run)[-1] == ("run.cancelled", "running", "cancelled")


@pytest.mark.parametrize("start", ["failed", "cancelled"])
def test_it_compensates_a_failed_or_cancelled_run(tenant, agent, alice, start):
    run = force_status(make_run(tenant, agent), start)
    operator = Actor.for_user(alice)
    runs.run_compensation_started(run=run, actor=operator, reason="undo it")
    assert Run.objects.get(pk=run.pk).status == "compensating"
    runs.run_compensation_finished(run=run, actor=operator, complete=True)
    assert Run.objects.get(pk=run.pk).status == "compensated"
    assert [e[0] for e in _events(run)[-2:]] == ["run.compensating", "run.compensated"]


def test_it_returns_a_run_to_failed_when_its_compensation_fails(tenant, agent, alice):
    run = force_status(make_run(tenant, agent), "compensating")
    runs.run_compensation_finished(
        run=run, actor=Actor.for_user(alice), complete=False, reason="1 step failed"
    )
    run.refresh_from_db()
    assert (run.status, run.failure_reason) == ("failed", "compensation_failed")
    assert _events(run)[-1] == ("run.compensation_failed", "compensating", "failed")


def test_it_resumes_a_failed_run(tenant, agent, alice):
    run = make_run(tenant, agent)
    runs.run_fail(run=run, actor=agent, error="boom")
    runs.run_resume(run=run, actor=Actor.for_user(alice), reason="API is back")
    run.refresh_from_db()
    assert run.status == "running" and run.finished_at is None
    assert _events(run)[-1] == ("run.resumed", "failed", "running")


@pytest.mark.parametrize("start", ["failed", "cancelled"])
def test_it_closes_a_failed_or_cancelled_run_with_a_reason(tenant, agent, alice, start):
    run = force_status(make_run(tenant, agent), start)
    runs.run_close(run=run, actor=Actor.for_user(alice), reason="handled by hand")
    assert Run.objects.get(pk=run.pk).status == "closed"


def test_it_refuses_to_close_without_a_reason(tenant, agent, alice):
    run = force_status(make_run(tenant, agent), "failed")
    with refused(run, current="failed", error=errors.ValidationFailed):
        runs.run_close(run=run, actor=Actor.for_user(alice), reason="  ")


# Each service with the states it may start from; every other state must be refused.
RUN_SERVICES = {
    "complete": (lambda run, actor: runs.run_complete(run=run, actor=actor), {"running"}),
    "fail": (lambda run, actor: runs.run_fail(run=run, actor=actor, error="x"), {"running", "succeeded"}),
    "cancel": (lambda run, actor: runs.run_cancel(run=run, actor=actor, reason="x"), {"running", "failed"}),
    "compensation_started": (
        lambda run, actor: runs.run_compensation_started(run=run, actor=actor, reason="x"),
        # succeeded, closed, compensated: a run flagged for review (recovery.actions.resolutions.run_flag).
        {"failed", "cancelled", "succeeded", "closed", "compensated"},
    ),
    "compensated": (
        lambda run, actor: runs.run_compensation_finished(run=run, actor=actor, complete=True),
        {"compensating"},
    ),
    "compensation_failed": (
        lambda run, actor: runs.run_compensation_finished(run=run, actor=actor, complete=False),
        {"compensating"},
    ),
    "partially_compensated": (
        lambda run, actor: runs.run_compensation_finished(run=run, actor=actor, complete=True, partial=True),
        {"compensating"},
    ),
    "resume": (lambda run, actor: runs.run_resume(run=run, actor=actor, reason="x"), {"failed", "succeeded"}),
    "close": (
        lambda run, actor: runs.run_close(run=run, actor=actor, reason="x"),
        {"failed", "cancelled"},
    ),
}
REFUSED_RUN_TRANSITIONS = [
    (name, state)
    for name, (_, allowed) in RUN_SERVICES.items()
    for state in ALL_RUN_STATES
    if state not in allowed
]


@pytest.mark.parametrize(("transition", "state"), REFUSED_RUN_TRANSITIONS)
def test_it_refuses_a_run_transition_the_state_machine_does_not_allow(tenant, agent, transition, state):
    run = force_status(make_run(tenant, agent), state)
    call, _ = RUN_SERVICES[transition]
    with refused(run, current=state):
        call(run, agent)


@pytest.mark.parametrize(
    ("transition", "state"),
    [(name, state) for name, (_, allowed) in RUN_SERVICES.items() for state in sorted(allowed)],
)
def test_it_allows_each_run_transition_from_each_allowed_state(tenant, agent, transition, state):
    run = force_status(make_run(tenant, agent), state)
    call, _ = RUN_SERVICES[transition]
    call(run, agent)
    assert Event.objects.filter(run=run, from_state=state).count() == 1


def test_it_lets_only_one_of_two_racing_transitions_win(tenant, agent):
    # A stale copy of the run (read before another process completed it) must lose cleanly.
    run = make_run(tenant, agent)
    stale = Run.objects.get(pk=run.pk)
    runs.run_complete(run=run, actor=agent)
    with refused(stale, current="succeeded"):
        runs.run_cancel(run=stale, actor=agent, reason="too late")


def test_it_records_a_heartbeat_without_an_audit_event(tenant, agent):
    run = make_run(tenant, agent)
    before = Run.objects.get(pk=run.pk).last_heartbeat_at
    events = Event.objects.count()
    runs.run_heartbeat(run=run)
    assert Run.objects.get(pk=run.pk).last_heartbeat_at > before
    assert Event.objects.count() == events
