"""Flagging any run for review, and partial, confirmed compensation:
services driven in-process (no worker), then the operator API through the whole URL stack."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from infra import errors
from ledger.audit import Actor
from ledger.models import Action, Checkpoint, Event, Run
from ledger.services import checkpoints, runs
from ledger.services.actions import moves
from recovery import compensators, planner, trail
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.actions.resolutions import item_close, item_resume, run_flag
from recovery.models import AgentCommand, RecoveryItem, Unwind, UnwindStep
from recovery.unwinds.advance import unwind_advance_move
from recovery.unwinds.claim import step_claim
from recovery.unwinds.runner import step_record_outcome
from tests.factories import load_reliability_policies, perform_action
from tests.support.api import Api, error_of


@dataclass
class Hire:
    """A run whose three undoable actions succeeded (``rel.do_1`` … ``rel.do_3``, each undone by
    ``rel.undo``), with a checkpoint written after the first."""

    run: Run
    first: Action
    second: Action
    third: Action
    checkpoint: Checkpoint

    @property
    def actions(self) -> list[Action]:
        return [self.first, self.second, self.third]


@pytest.fixture(autouse=True)
def _policies(db):
    load_reliability_policies()


def _hire(tenant, agent, *, finish: str = "succeed") -> Hire:
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu Kumar")

    def do(n: int) -> Action:
        return perform_action(
            run,
            agent,
            f"rel.do_{n}",
            target_type="thing",
            target_id=f"thing-{n}",
            args={"n": n},
            compensation={"tool": "rel.undo", "args": {"n": n}},
            after={"n": n},
        )

    first = do(1)
    checkpoint = checkpoints.checkpoint_write(run=run, actor=agent, name="account-created")
    second, third = do(2), do(3)
    if finish == "succeed":
        runs.run_complete(run=run, actor=agent, summary="all done")
    elif finish == "fail":
        run_fail_and_queue(run=run, actor=agent, error="mail gateway down")
    run.refresh_from_db()
    return Hire(run=run, first=first, second=second, third=third, checkpoint=checkpoint)


def _drive(unwind: Unwind) -> Unwind:
    """Carry the unwind out in-process, every compensator answering "done"."""
    for _ in range(20):
        unwind_advance_move(unwind_id=unwind.pk)
        step = unwind.steps.filter(status=UnwindStep.Status.QUEUED).first()
        if step is None:
            break
        claim = step_claim(step_id=step.pk)
        assert claim is not None
        step_record_outcome(step_id=step.pk, token=claim.token, outcome=compensators.Outcome.done())
    unwind.refresh_from_db()
    return unwind


def _statuses(hire: Hire) -> list[str]:
    return [Action.objects.get(pk=a.pk).status for a in hire.actions]


RUN_STATE = ("status", "error", "failure_reason", "finished_at", "updated_at", "summary")


def _snapshot(hire: Hire) -> tuple:
    """What a refused decision must leave untouched."""
    # The audit head moves: a refusal is audited on the run's chain.
    return (
        Run.objects.filter(pk=hire.run.pk).values(*RUN_STATE).get(),
        list(RecoveryItem.objects.filter(run=hire.run).order_by("id").values()),
        _statuses(hire),
        Unwind.objects.filter(run=hire.run).count(),
    )


# --- Flag --------------------------------------------------------------------------------------


def test_it_flags_a_succeeded_run_into_the_queue_as_manual(tenant, agent, alice):
    hire = _hire(tenant, agent)
    assert not RecoveryItem.objects.filter(run=hire.run).exists()

    item = run_flag(run=hire.run, actor=Actor.for_user(alice), reason="HR cancelled the hire")

    assert (item.status, item.reason) == (RecoveryItem.Status.OPEN, RecoveryItem.Reason.MANUAL)
    assert "HR cancelled the hire" in item.error and "alice" in item.error
    assert [f["reason"] for f in item.details["flags"]] == ["HR cancelled the hire"]
    # Flagging decides nothing: the run and its actions are as they were.
    assert Run.objects.get(pk=hire.run.pk).status == Run.Status.SUCCEEDED
    assert _statuses(hire) == ["succeeded"] * 3
    event = Event.objects.get(run=hire.run, kind="run.flagged")
    assert (event.actor_label, event.reason, event.from_state) == (
        "alice",
        "HR cancelled the hire",
        "succeeded",
    )
    # The trail names who flagged it.
    reviewers = trail.run_trail(run=hire.run)["reviewed_by"]
    assert [(r["who"], r["decision"]) for r in reviewers] == [("alice", "flagged the run for review")]


def test_flagging_a_queued_run_updates_its_item_and_keeps_its_reason(tenant, agent, alice, dave):
    hire = _hire(tenant, agent, finish="fail")
    item = RecoveryItem.objects.get(run=hire.run)
    assert item.reason == RecoveryItem.Reason.FAILED

    again = run_flag(run=hire.run, actor=Actor.for_user(alice), reason="look at this one")
    third = run_flag(run=hire.run, actor=Actor.for_user(dave), reason="and this")

    assert again.pk == third.pk == item.pk
    assert RecoveryItem.objects.filter(run=hire.run).count() == 1
    third.refresh_from_db()
    # The specific reason stays (manual would hide it); both flags are on the item.
    assert third.reason == RecoveryItem.Reason.FAILED and third.error == "mail gateway down"
    assert [(f["by"], f["reason"]) for f in third.details["flags"]] == [
        ("alice", "look at this one"),
        ("dave", "and this"),
    ]


def test_flagging_a_run_being_compensated_is_refused_and_audited(tenant, agent, alice):
    hire = _hire(tenant, agent, finish="fail")
    item = RecoveryItem.objects.get(run=hire.run)
    unwind_start(item=item, actor=Actor.for_user(alice), reason="undo it")
    before = _snapshot(hire)

    with pytest.raises(errors.InvalidTransition) as excinfo:
        run_flag(run=hire.run, actor=Actor.for_user(alice), reason="flag it too")

    assert excinfo.value.status == 409 and excinfo.value.current == "compensating"
    assert _snapshot(hire) == before
    refusal = Event.objects.get(run=hire.run, kind="decision.refused")
    assert (refusal.to_state, refusal.from_state, refusal.actor_label) == ("flag", "compensating", "alice")
    assert not Event.objects.filter(run=hire.run, kind="run.flagged").exists()


def test_flagging_needs_a_reason(tenant, agent, alice):
    hire = _hire(tenant, agent)
    with pytest.raises(errors.ValidationFailed):
        run_flag(run=hire.run, actor=Actor.for_user(alice), reason="   ")
    assert not RecoveryItem.objects.filter(run=hire.run).exists()


def test_a_flagged_succeeded_run_is_compensated_like_a_failed_one(tenant, agent, alice):
    hire = _hire(tenant, agent)
    item = run_flag(run=hire.run, actor=Actor.for_user(alice), reason="HR cancelled the hire")

    unwind = _drive(unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the hire"))

    assert unwind.status == Unwind.Status.COMPLETED
    assert _statuses(hire) == ["compensated"] * 3
    assert Run.objects.get(pk=hire.run.pk).status == Run.Status.COMPENSATED
    item.refresh_from_db()
    assert (item.status, item.resolution) == ("resolved", RecoveryItem.Resolution.COMPENSATED)
    moves = list(
        Event.objects.filter(run=hire.run, subject_type="run", kind__startswith="run.compensat").values_list(
            "from_state", "to_state"
        )
    )
    assert moves == [("succeeded", "compensating"), ("compensating", "compensated")]


def test_a_flagged_succeeded_run_can_be_resumed_or_closed(tenant, agent, alice):
    resumed = _hire(tenant, agent)
    item = run_flag(run=resumed.run, actor=Actor.for_user(alice), reason="redo the mail")
    command = item_resume(item=item, actor=Actor.for_user(alice), reason="mail is back")
    assert command.kind == AgentCommand.Kind.RESUME
    assert Run.objects.get(pk=resumed.run.pk).status == Run.Status.RUNNING

    closed = _hire(tenant, agent)
    item = run_flag(run=closed.run, actor=Actor.for_user(alice), reason="double check")
    item_close(item=item, actor=Actor.for_user(alice), reason="checked: all fine")
    item.refresh_from_db()
    assert item.resolution == RecoveryItem.Resolution.CLOSED
    # Closing the review of a succeeded run leaves it succeeded: nothing failed.
    assert Run.objects.get(pk=closed.run.pk).status == Run.Status.SUCCEEDED
    assert _statuses(closed) == ["succeeded"] * 3


def test_a_flagged_running_run_must_be_cancelled_before_it_is_compensated(tenant, agent, alice):
    hire = _hire(tenant, agent, finish="")
    item = run_flag(run=hire.run, actor=Actor.for_user(alice), reason="looks wrong")
    before = _snapshot(hire)

    with pytest.raises(errors.InvalidTransition) as excinfo:
        unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")

    assert "cancel it first" in excinfo.value.message
    assert _snapshot(hire) == before


# --- The plan's hash and the selection -------------------------------------------------------------


def test_the_plan_hash_is_stable_and_changes_when_the_plan_does(tenant, agent, alice):
    hire = _hire(tenant, agent, finish="")
    late = perform_action(
        hire.run,
        agent,
        "rel.do_4",
        target_type="thing",
        target_id="thing-4",
        args={"n": 4},
        compensation={"tool": "rel.undo", "args": {"n": 4}},
        unknown=True,
    )
    runs.run_fail(run=hire.run, actor=agent, error="gave up")
    shown = planner.compensation_plan(run=hire.run)
    assert shown.plan_hash == planner.compensation_plan(run=hire.run).plan_hash
    # A selection does not change the hash: it fingerprints the plan the operator read.
    assert planner.compensation_plan(run=hire.run, action_ids=[hire.first.pk]).plan_hash == shown.plan_hash

    # Someone confirms the timed-out call happened: a step is added to the plan.
    moves.action_reconcile(action=late, actor=Actor.for_user(alice), happened=True, reason="it did")
    now = planner.compensation_plan(run=hire.run)
    assert now.plan_hash != shown.plan_hash and len(now.steps) == 4

    # Edited compensation args change it too.
    Action.objects.filter(pk=hire.first.pk).update(compensation_args={"n": 99})
    assert planner.compensation_plan(run=hire.run).plan_hash != now.plan_hash


def test_a_stale_plan_hash_is_plan_changed_and_nothing_starts(tenant, agent, alice, dave):
    hire = _hire(tenant, agent, finish="")
    late = perform_action(
        hire.run,
        agent,
        "rel.do_4",
        target_type="thing",
        target_id="thing-4",
        args={"n": 4},
        compensation={"tool": "rel.undo", "args": {"n": 4}},
        unknown=True,
    )
    run_fail_and_queue(run=hire.run, actor=agent, error="gave up")
    item = RecoveryItem.objects.get(run=hire.run)
    seen = planner.compensation_plan(run=hire.run).plan_hash  # Alice reads the plan…
    moves.action_reconcile(action=late, actor=Actor.for_user(dave), happened=True, reason="it did")  # …Dave
    before = _snapshot(hire)

    with pytest.raises(errors.PlanChanged) as excinfo:
        unwind_start(
            item=item, actor=Actor.for_user(alice), reason="undo", action_ids=[hire.third.pk], plan_hash=seen
        )

    now = planner.compensation_plan(run=hire.run).plan_hash
    assert excinfo.value.status == 409 and excinfo.value.code == "plan_changed"
    assert excinfo.value.details["plan_hash"] == now != seen
    assert _snapshot(hire) == before
    assert Event.objects.filter(run=hire.run, kind="decision.refused", to_state="compensate").count() == 1

    unwind = unwind_start(
        item=item, actor=Actor.for_user(alice), reason="undo", action_ids=[hire.third.pk], plan_hash=now
    )
    assert [s.action_id for s in unwind.steps.order_by("position")] == [hire.third.pk]


def test_it_undoes_only_the_chosen_actions_newest_first_and_keeps_the_rest(tenant, agent, alice):
    hire = _hire(tenant, agent)
    item = run_flag(run=hire.run, actor=Actor.for_user(alice), reason="HR cancelled the hire")
    shown = planner.compensation_plan(run=hire.run)

    unwind = unwind_start(
        item=item,
        actor=Actor.for_user(alice),
        reason="undo the licence only",
        action_ids=[hire.first.pk, hire.third.pk],  # in any order: the plan's order wins
        plan_hash=shown.plan_hash,
    )

    assert [s.action_id for s in unwind.steps.order_by("position")] == [hire.third.pk, hire.first.pk]
    assert unwind.plan["selection"]["mode"] == "action_ids"
    assert unwind.plan["selection"]["action_ids"] == [hire.third.pk, hire.first.pk]
    assert [k["action_id"] for k in unwind.plan["kept"]] == [hire.second.pk]
    assert unwind.plan["plan_hash"] == shown.plan_hash

    _drive(unwind)

    assert _statuses(hire) == ["compensated", "succeeded", "compensated"]
    # Not everything undoable was undone: the run is closed (decided), not compensated.
    run = Run.objects.get(pk=hire.run.pk)
    assert run.status == Run.Status.CLOSED
    finished = Event.objects.get(run=hire.run, kind="run.partially_compensated")
    assert (finished.from_state, finished.to_state) == ("compensating", "closed")
    assert "kept as the operator chose: rel.do_2" in finished.reason
    item.refresh_from_db()
    assert item.resolution == RecoveryItem.Resolution.COMPENSATED
    assert [k["action_id"] for k in item.details["kept"]] == [hire.second.pk]
    assert "partial: kept rel.do_2" in item.resolution_note

    told = trail.run_trail(run=run)
    assert [e["action_id"] for e in told["kept"]] == [hire.second.pk]
    assert "alice chose to keep it" in told["kept"][0]["reason"]
    assert {e["action_id"] for e in told["restored"]} == {hire.first.pk, hire.third.pk}
    assert told["not_undone"] == []
    assert "Partially compensated: 2 put back, 1 kept as the operator chose" in told["summary"]
    assert trail.kept_action_ids(run=run) == {hire.second.pk}


def test_the_kept_action_can_still_be_undone_later(tenant, agent, alice):
    hire = _hire(tenant, agent)
    item = run_flag(run=hire.run, actor=Actor.for_user(alice), reason="undo the licence")
    _drive(unwind_start(item=item, actor=Actor.for_user(alice), reason="x", action_ids=[hire.third.pk]))
    assert Run.objects.get(pk=hire.run.pk).status == Run.Status.CLOSED

    item = run_flag(run=hire.run, actor=Actor.for_user(alice), reason="HR changed its mind")
    _drive(unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the rest"))

    assert _statuses(hire) == ["compensated"] * 3
    assert Run.objects.get(pk=hire.run.pk).status == Run.Status.COMPENSATED
    assert trail.run_trail(run=hire.run)["kept"] == []


def test_to_checkpoint_undoes_what_completed_after_it(tenant, agent, alice):
    hire = _hire(tenant, agent, finish="fail")
    item = RecoveryItem.objects.get(run=hire.run)
    preview = planner.compensation_plan(run=hire.run, to_checkpoint=hire.checkpoint.pk)
    assert [s.action.pk for s in preview.steps] == [hire.third.pk, hire.second.pk]
    assert [s.action.pk for s in preview.kept] == [hire.first.pk]

    unwind = _drive(
        unwind_start(
            item=item,
            actor=Actor.for_user(alice),
            reason="back to the account",
            to_checkpoint=hire.checkpoint.pk,
        )
    )

    assert unwind.plan["selection"] == {
        "mode": "to_checkpoint",
        "action_ids": [hire.third.pk, hire.second.pk],
        "checkpoint_id": hire.checkpoint.pk,
        "checkpoint_name": "account-created",
    }
    assert _statuses(hire) == ["succeeded", "compensated", "compensated"]
    assert Run.objects.get(pk=hire.run.pk).status == Run.Status.CLOSED


def test_choosing_every_undoable_action_is_a_full_compensation(tenant, agent, alice):
    hire = _hire(tenant, agent, finish="fail")
    item = RecoveryItem.objects.get(run=hire.run)
    _drive(
        unwind_start(
            item=item, actor=Actor.for_user(alice), reason="all", action_ids=[a.pk for a in hire.actions]
        )
    )
    assert Run.objects.get(pk=hire.run.pk).status == Run.Status.COMPENSATED
    assert trail.run_trail(run=hire.run)["kept"] == []


@pytest.mark.parametrize(
    "choice",
    ["both", "other_runs_action", "unknown_id", "not_undoable", "read_only", "none", "other_runs_checkpoint"],
)
def test_a_bad_selection_is_422_naming_it_and_changes_nothing(tenant, agent, alice, choice):
    hire = _hire(tenant, agent, finish="")
    failed = perform_action(
        hire.run, agent, "rel.do_9", target_type="thing", target_id="t9", args={}, fail="400 bad request"
    )
    lookup = perform_action(hire.run, agent, "rel.do_8", target_id="t8", args={})
    Action.objects.filter(pk=lookup.pk).update(action_class="read_only")  # changed nothing
    run_fail_and_queue(run=hire.run, actor=agent, error="gave up")
    other = _hire(tenant, agent)
    item = RecoveryItem.objects.get(run=hire.run)
    named = {
        "both": None,
        "other_runs_action": other.first.pk,
        "unknown_id": "act_doesnotexist",
        "not_undoable": failed.pk,
        "read_only": lookup.pk,
        "none": None,
        "other_runs_checkpoint": other.checkpoint.pk,
    }[choice]
    kwargs: dict = {
        "both": {"action_ids": [hire.first.pk], "to_checkpoint": hire.checkpoint.pk},
        "other_runs_action": {"action_ids": [hire.first.pk, other.first.pk]},
        "unknown_id": {"action_ids": ["act_doesnotexist"]},
        "not_undoable": {"action_ids": [failed.pk]},
        "read_only": {"action_ids": [lookup.pk]},
        "none": {"action_ids": []},
        "other_runs_checkpoint": {"to_checkpoint": other.checkpoint.pk},
    }[choice]
    before = _snapshot(hire)

    with pytest.raises(errors.ValidationFailed) as excinfo:
        unwind_start(item=item, actor=Actor.for_user(alice), reason="undo", **kwargs)

    assert excinfo.value.status == 422
    if named is not None:
        assert named in excinfo.value.message
    if choice in ("other_runs_action", "unknown_id", "not_undoable", "read_only"):
        assert excinfo.value.details["action_ids"] == [named]
    assert _snapshot(hire) == before
    assert Event.objects.filter(run=hire.run, kind="decision.refused", to_state="compensate").count() == 1


# --- Through the API ---------------------------------------------------------------------------


@pytest.fixture
def api(operator_key):
    return Api(operator_key[1])


def test_api_flag_is_for_operator_keys_of_the_tenant(tenant, agent, agent_key, outsider_key, api):
    hire = _hire(tenant, agent)
    path = f"/runs/{hire.run.pk}/flag"
    assert Api(agent_key[1]).post(path, {"reason": "mine"}).status_code == 403
    assert Api(outsider_key[1]).post(path, {"reason": "mine"}).status_code == 404
    assert api.post("/runs/run_nope/flag", {"reason": "x"}).status_code == 404
    assert api.post(path, {"reason": ""}).status_code == 422
    assert api.post(path, {"reason": "x", "extra": 1}).status_code == 422
    assert not RecoveryItem.objects.filter(run=hire.run).exists()

    response = api.post(path, {"reason": "HR cancelled the hire"})

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["reason"], body["status"], body["run"]["status"]) == ("manual", "open", "succeeded")
    assert body["details"]["flags"][0]["by"] == "supervisor"
    again = api.post(path, {"reason": "still"})
    assert again.status_code == 201 and again.json()["id"] == body["id"]
    assert len(again.json()["details"]["flags"]) == 2


def test_api_flag_on_a_compensating_run_is_409(tenant, agent, alice, api):
    hire = _hire(tenant, agent, finish="fail")
    unwind_start(item=RecoveryItem.objects.get(run=hire.run), actor=Actor.for_user(alice), reason="x")
    response = api.post(f"/runs/{hire.run.pk}/flag", {"reason": "too"})
    assert response.status_code == 409
    assert error_of(response)["code"] == "invalid_transition"


def test_api_partial_compensation_with_plan_hash_and_the_trail_lists_what_was_kept(tenant, agent, api):
    hire = _hire(tenant, agent)
    item = api.post(f"/runs/{hire.run.pk}/flag", {"reason": "undo the licence"}).json()

    detail = api.get(f"/recovery/{item['id']}").json()
    plan = detail["plan"]
    assert len(plan["plan_hash"]) == 64 and plan["kept"] == [] and plan["selection"]["mode"] == "all"
    assert [s["action_id"] for s in plan["steps"]] == [hire.third.pk, hire.second.pk, hire.first.pk]
    chosen = api.get(f"/recovery/{item['id']}", {"action_ids": [hire.second.pk]}).json()["plan"]
    assert [s["action_id"] for s in chosen["steps"]] == [hire.second.pk]
    assert [s["action_id"] for s in chosen["kept"]] == [hire.third.pk, hire.first.pk]
    assert chosen["plan_hash"] == plan["plan_hash"]
    bad_preview = api.get(f"/recovery/{item['id']}", {"action_ids": ["act_nope"]})
    assert bad_preview.status_code == 422 and "act_nope" in error_of(bad_preview)["message"]

    both = api.post(
        f"/recovery/{item['id']}/compensate",
        {"reason": "x", "action_ids": [hire.second.pk], "to_checkpoint": hire.checkpoint.pk},
    )
    assert both.status_code == 422
    stale = api.post(
        f"/recovery/{item['id']}/compensate",
        {"reason": "x", "action_ids": [hire.second.pk], "plan_hash": "0" * 64},
    )
    assert stale.status_code == 409
    assert error_of(stale)["code"] == "plan_changed"
    assert error_of(stale)["details"]["plan_hash"] == plan["plan_hash"]
    assert not Unwind.objects.filter(run=hire.run).exists()

    response = api.post(
        f"/recovery/{item['id']}/compensate",
        {"reason": "keep the account", "action_ids": [hire.second.pk], "plan_hash": plan["plan_hash"]},
    )
    assert response.status_code == 202, response.content
    assert [s["action_id"] for s in response.json()["steps"]] == [hire.second.pk]
    _drive(Unwind.objects.get(pk=response.json()["id"]))

    told = api.get(f"/runs/{hire.run.pk}/trail").json()
    assert told["status"] == "closed"
    assert sorted(e["action_id"] for e in told["kept"]) == sorted([hire.first.pk, hire.third.pk])
    assert [e["action_id"] for e in told["restored"]] == [hire.second.pk]
    assert "Partially compensated" in told["summary"]


def test_api_compensate_without_a_selection_still_undoes_everything(tenant, agent, api):
    hire = _hire(tenant, agent, finish="fail")
    item = RecoveryItem.objects.get(run=hire.run)
    response = api.post(f"/recovery/{item.pk}/compensate", {"reason": "all of it"})
    assert response.status_code == 202
    _drive(Unwind.objects.get(pk=response.json()["id"]))
    assert Run.objects.get(pk=hire.run.pk).status == Run.Status.COMPENSATED
    assert api.get(f"/runs/{hire.run.pk}/trail").json()["kept"] == []
