"""Pauses (kill switches): pausing and lifting, what they refuse and what they let through, the
audit of every pause, lift and refusal, and the cost on the hot path."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Event, Pause, Run
from ledger.scoping import Reach
from ledger.services import pauses, runs
from ledger.services.keys import agent_key_create
from recovery.actions.approvals import action_record_gated
from tests.factories import make_run, record


@pytest.fixture
def alice_actor(alice) -> Actor:
    return Actor.for_user(alice)


def _pause(tenant, actor, **fields) -> Pause:
    fields.setdefault("reason", "refund bug, INC-42")
    return pauses.pause_create(tenant=tenant, actor=actor, **fields)


def _record_gated(run: Run, agent: Actor, key: str, tool: str = "hr.create_user") -> Action:
    return action_record_gated(
        run=run, actor=agent, tool=tool, idempotency_key=key, args={"email": f"{key}@company.com"}
    ).action


def _tenant_events(tenant, kind: str) -> list[Event]:
    return list(Event.objects.filter(tenant=tenant, run__isnull=True, kind=kind).order_by("id"))


# --- Pausing and lifting ----------------------------------------------------------------------


def test_it_pauses_a_tool_audited_with_who_and_why(tenant, alice_actor):
    pause = _pause(tenant, alice_actor, tool="  payments.*  ")
    assert (pause.pk[:4], pause.agent, pause.tool, pause.is_active) == ("pau_", "", "payments.*", True)
    assert pause.created_by.get_username() == "alice"
    [event] = _tenant_events(tenant, "pause.created")
    assert (event.subject_id, event.to_state, event.actor_label, event.reason) == (
        pause.pk,
        "active",
        "alice",
        "refund bug, INC-42",
    )
    assert event.data == {"agent": "", "tool": "payments.*"}


def test_it_refuses_a_pause_naming_neither_agent_nor_tool(tenant, alice_actor):
    for blank in ({}, {"agent": "  ", "tool": ""}):
        with pytest.raises(errors.ValidationFailed) as excinfo:
            _pause(tenant, alice_actor, **blank)
        assert excinfo.value.status == 422
        assert "agent, a tool or both" in excinfo.value.message
    assert not Pause.objects.exists()
    assert not Event.objects.filter(kind="pause.created").exists()


def test_it_refuses_a_pause_without_a_reason_or_with_a_name_too_long(tenant, alice_actor):
    with pytest.raises(errors.ValidationFailed, match="reason is required"):
        _pause(tenant, alice_actor, tool="payments.refund", reason="  ")
    with pytest.raises(errors.ValidationFailed, match="at most 200"):
        _pause(tenant, alice_actor, tool="x" * 201)
    assert not Pause.objects.exists()


def test_it_lifts_a_pause_once_and_refuses_the_second_lift(tenant, alice_actor, bob):
    pause = _pause(tenant, alice_actor, agent="onboarding")
    pauses.pause_lift(pause=pause, actor=alice_actor, reason="fixed in v2.3")
    stored = Pause.objects.get(pk=pause.pk)
    assert (stored.is_active, stored.lift_reason, stored.lifted_by.get_username()) == (
        False,
        "fixed in v2.3",
        "alice",
    )
    [event] = _tenant_events(tenant, "pause.lifted")
    assert (event.from_state, event.to_state, event.reason, event.actor_label) == (
        "active",
        "lifted",
        "fixed in v2.3",
        "alice",
    )
    # Bob's tab still showed it active: his lift loses cleanly and changes nothing.
    before = Pause.objects.filter(pk=pause.pk).values().get()
    with pytest.raises(errors.InvalidTransition) as excinfo:
        pauses.pause_lift(pause=pause, actor=Actor.for_user(bob), reason="me too")
    assert (excinfo.value.status, excinfo.value.code) == (409, "invalid_transition")
    assert Pause.objects.filter(pk=pause.pk).values().get() == before
    assert len(_tenant_events(tenant, "pause.lifted")) == 1


def test_a_lift_needs_a_reason(tenant, alice_actor):
    pause = _pause(tenant, alice_actor, tool="payments.refund")
    with pytest.raises(errors.ValidationFailed):
        pauses.pause_lift(pause=pause, actor=alice_actor, reason="")
    assert Pause.objects.get(pk=pause.pk).is_active


# --- What a pause refuses ---------------------------------------------------------------------


def test_a_tool_pause_refuses_a_new_action_naming_the_pause_and_records_nothing(tenant, agent, alice_actor):
    run = make_run(tenant, agent)
    record(run, agent, "k1")
    pause = _pause(tenant, alice_actor, tool="hr.*")
    with pytest.raises(errors.Paused) as excinfo:
        _record_gated(run, agent, "k2")
    exc = excinfo.value
    assert (exc.status, exc.code) == (409, "paused")
    assert exc.details == {"pause_id": pause.pk, "agent": "", "tool": "hr.*"}
    assert pause.pk in exc.message and "refund bug, INC-42" in exc.message and "alice" in exc.message
    assert list(Action.objects.filter(run=run).values_list("idempotency_key", flat=True)) == ["k1"]
    assert Run.objects.get(pk=run.pk).action_count == 1
    # The refusal is on the run's audit chain.
    refused = Event.objects.filter(run=run, kind="action.refused").get()
    assert refused.data["code"] == "paused"
    assert refused.data["tool"] == "hr.create_user"
    assert refused.data["details"]["pause_id"] == pause.pk


def test_a_tool_pause_lets_other_tools_through(tenant, agent, alice_actor):
    run = make_run(tenant, agent)
    _pause(tenant, alice_actor, tool="payments.*")
    assert record(run, agent, "k1", tool="hr.create_user").tool == "hr.create_user"
    with pytest.raises(errors.Paused):
        record(run, agent, "k2", tool="payments.refund")
    # Case-sensitive, like tool policies: PAYMENTS.refund is another tool.
    assert record(run, agent, "k3", tool="PAYMENTS.refund").tool == "PAYMENTS.refund"


def test_an_agent_pause_refuses_new_runs_audited_on_the_tenant_chain(tenant, agent, alice_actor):
    pause = _pause(tenant, alice_actor, agent="onboard*")
    with pytest.raises(errors.Paused) as excinfo:
        make_run(tenant, agent, external_id="ticket-7")
    assert excinfo.value.details == {"pause_id": pause.pk, "agent": "onboard*", "tool": ""}
    assert "no run was started" in excinfo.value.message
    assert not Run.objects.exists()
    [event] = _tenant_events(tenant, "run.refused")
    assert (event.subject_type, event.subject_id, event.actor_label) == (
        "pause",
        pause.pk,
        "onboarding-agent",
    )
    assert event.data["agent"] == "onboarding" and event.data["external_id"] == "ticket-7"
    assert event.data["code"] == "paused"


def test_an_agent_pause_matches_the_keys_name_whatever_the_run_declares(tenant, agent, alice_actor):
    # The key is "onboarding-agent"; the runs call themselves something else.
    _pause(tenant, alice_actor, agent="onboarding-agent")
    for declared in ("onboarding", "totally-different"):
        with pytest.raises(errors.Paused):
            runs.run_create(tenant=tenant, actor=agent, agent=declared, request="Onboard Ashu")
    assert not Run.objects.exists()


def test_an_agent_pause_refuses_new_actions_in_that_agents_runs_only(tenant, agent, alice_actor):
    other_key = agent_key_create(tenant=tenant, name="billing-agent", scopes=["agent"], actor=Actor.system())
    billing = Actor.for_key(other_key.key)
    mine, theirs = make_run(tenant, agent), make_run(tenant, billing)
    _pause(tenant, alice_actor, agent="onboarding-agent")
    with pytest.raises(errors.Paused) as excinfo:
        record(mine, agent, "k1")
    assert "Agent onboarding is paused" in excinfo.value.message
    assert record(theirs, billing, "k2").run_id == theirs.pk


def test_an_agent_and_tool_pause_refuses_only_that_tool_of_that_agent(tenant, agent, alice_actor):
    other_key = agent_key_create(tenant=tenant, name="billing-agent", scopes=["agent"], actor=Actor.system())
    billing = Actor.for_key(other_key.key)
    _pause(tenant, alice_actor, agent="onboarding", tool="payments.refund")
    run = make_run(tenant, agent)  # its runs still start
    assert record(run, agent, "k1", tool="hr.create_user")
    with pytest.raises(errors.Paused) as excinfo:
        record(run, agent, "k2", tool="payments.refund")
    assert excinfo.value.message.startswith("payments.refund is paused")
    theirs = runs.run_create(tenant=tenant, actor=billing, agent="billing", request="Refund order 1")
    assert record(theirs, billing, "k3", tool="payments.refund").tool == "payments.refund"


def test_a_replay_of_an_action_recorded_before_the_pause_is_still_answered(tenant, agent, alice_actor):
    run = make_run(tenant, agent)
    first = record(run, agent, "k1")
    _pause(tenant, alice_actor, tool="hr.create_user")
    assert record(run, agent, "k1").pk == first.pk


def test_an_action_recorded_before_the_pause_does_not_start_until_it_is_lifted(tenant, agent, alice_actor):
    from ledger.services.actions.moves import action_start
    from tests.factories import load_onboarding_policies

    load_onboarding_policies()  # hr.create_user: automatic approval, so only the pause can stop it
    run = make_run(tenant, agent)
    planned = record(run, agent, "k1")
    pause = _pause(tenant, alice_actor, tool="hr.*")
    with pytest.raises(errors.Paused, match="the action was not started"):
        action_start(action=Action.objects.get(pk=planned.pk), actor=agent)
    assert Action.objects.get(pk=planned.pk).status == Action.Status.PLANNED
    pauses.pause_lift(pause=pause, actor=alice_actor, reason="fixed")
    started = action_start(action=Action.objects.get(pk=planned.pk), actor=agent)
    assert started.status == Action.Status.RUNNING


def test_after_the_lift_new_work_is_accepted_again(tenant, agent, alice_actor):
    pause = _pause(tenant, alice_actor, agent="onboarding")
    with pytest.raises(errors.Paused):
        make_run(tenant, agent)
    pauses.pause_lift(pause=pause, actor=alice_actor, reason="fixed")
    run = make_run(tenant, agent)
    assert record(run, agent, "k1").status == Action.Status.PLANNED


def test_another_tenants_pause_changes_nothing_here(tenant, other_tenant, agent, mallory):
    _pause(other_tenant, Actor.for_user(mallory), agent="*")
    run = make_run(tenant, agent)
    assert record(run, agent, "k1")


# --- Reads ------------------------------------------------------------------------------------


def test_it_lists_active_lifted_and_all_newest_first(tenant, other_tenant, alice_actor, mallory):
    first = _pause(tenant, alice_actor, tool="a.*")
    second = _pause(tenant, alice_actor, tool="b.*")
    _pause(other_tenant, Actor.for_user(mallory), tool="c.*")
    pauses.pause_lift(pause=first, actor=alice_actor, reason="done")
    ids = {
        status: [p.pk for p in pauses.pauses_list(tenant_ids=[tenant.pk], status=status).items]
        for status in ("active", "lifted", "all")
    }
    assert ids == {"active": [second.pk], "lifted": [first.pk], "all": [second.pk, first.pk]}
    page = pauses.pauses_list(tenant_ids=[tenant.pk], status="all", limit=1)
    assert [p.pk for p in page.items] == [second.pk] and page.next_cursor
    rest = pauses.pauses_list(tenant_ids=[tenant.pk], status="all", cursor=page.next_cursor, limit=1)
    assert ([p.pk for p in rest.items], rest.next_cursor) == ([first.pk], None)
    with pytest.raises(errors.ValidationFailed):
        pauses.pauses_list(tenant_ids=[tenant.pk], status="paused")
    with pytest.raises(errors.NotFound):
        pauses.pause_get(reach=Reach.of_tenants([other_tenant.pk]), pause_id=first.pk)


def test_it_says_which_active_pauses_cover_a_run(tenant, agent, alice_actor):
    run = make_run(tenant, agent)
    record(run, agent, "k1", tool="hr.create_user")
    by_tool = _pause(tenant, alice_actor, tool="hr.*")
    by_agent = _pause(tenant, alice_actor, agent="onboarding-agent")
    _pause(tenant, alice_actor, tool="payments.*")  # a tool the run never used
    _pause(tenant, alice_actor, agent="billing", tool="hr.*")  # another agent
    lifted = _pause(tenant, alice_actor, agent="*")
    pauses.pause_lift(pause=lifted, actor=alice_actor, reason="too broad")
    assert [p.pk for p in pauses.pauses_covering_run(run=run)] == [by_tool.pk, by_agent.pk]
    assert pauses.running_runs_covered(tenant=tenant, agent="onboarding", tool="") == 1
    assert pauses.running_runs_covered(tenant=tenant, agent="", tool="hr.create_user") == 1
    assert pauses.running_runs_covered(tenant=tenant, agent="", tool="payments.*") == 0


def test_a_pause_covers_the_run_it_refused_with_the_tools_it_refused(tenant, agent, alice_actor):
    """A run that never used the paused tool: the refusal (an audit event on the run, no action
    row) is what says the pause stopped it."""
    run, other = make_run(tenant, agent), make_run(tenant, agent)
    record(run, agent, "k1", tool="hr.create_user")
    pause = _pause(tenant, alice_actor, tool="payments.*")
    assert pauses.pauses_on_run(run=run) == []
    for key in ("r1", "r2"):  # refused twice: the tool is named once
        with pytest.raises(errors.Paused):
            _record_gated(run, agent, key, tool="payments.refund")
    assert pauses.pauses_on_run(run=run) == [
        pauses.PauseOnRun(
            pause=pauses.pause_get(reach=Reach.of_tenants([tenant.pk]), pause_id=pause.pk),
            refused_tools=("payments.refund",),
        )
    ]
    assert pauses.pauses_on_run(run=other) == []
    assert not Action.objects.filter(run=run, tool="payments.refund").exists()
    assert Event.objects.filter(run=run, kind=pauses.ACTION_REFUSED).count() == 2


def test_the_refusal_costs_its_own_write_and_a_refused_record_nothing_more(tenant, agent, alice_actor):
    """The refused record rolled back; its audit event is one transaction of its own (lock the run,
    append the event), whatever the number of pauses."""
    run = make_run(tenant, agent)
    record(run, agent, "warm-up")
    _pause(tenant, alice_actor, tool="payments.*")

    def writes(key: str) -> list[str]:
        with CaptureQueriesContext(connection) as queries, pytest.raises(errors.Paused):
            _record_gated(run, agent, key, tool="payments.refund")
        return [q["sql"] for q in queries.captured_queries if q["sql"].startswith(("INSERT", "UPDATE"))]

    first = writes("r1")
    assert any("ledger_event" in sql for sql in first)
    _pause(tenant, alice_actor, agent="billing")
    assert len(writes("r2")) == len(first)


# --- The hot path -----------------------------------------------------------------------------


def test_without_pauses_a_record_is_one_statement_and_with_them_the_check_costs_none_per_pause(
    tenant, agent, alice_actor
):
    """No active pause in the tenant: the record is one call (``saga_action_record`` checks that
    none is active in it). With pauses in force, their patterns are checked in Python under the
    run's lock, read in the statement that locks the run: as many statements with two pauses (that
    do not match) as with five."""
    run = make_run(tenant, agent)
    record(run, agent, "warm-up")

    def statements(key: str) -> int:
        with CaptureQueriesContext(connection) as queries:
            record(run, agent, key)
        return len(queries.captured_queries)

    assert statements("k1") == 1
    _pause(tenant, alice_actor, tool="payments.*")
    _pause(tenant, alice_actor, agent="billing")
    with_two = statements("k2")
    for n in range(3):
        _pause(tenant, alice_actor, tool=f"other{n}.*")
    assert statements("k3") == with_two
