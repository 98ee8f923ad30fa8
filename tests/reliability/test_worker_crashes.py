"""Scenarios 1, 2, 4 and 9: workers die mid-step (SIGKILL of the whole process group, a
compensator that kills its own process, a kill/start loop) and the audit history still holds."""

from __future__ import annotations

import random
import threading
import time

import pytest

from ledger.audit import Actor
from ledger.models import Event
from recovery.actions.compensations import unwind_start
from recovery.models import RecoveryItem, Unwind, UnwindStep
from tests.factories import UNDO_PATH, failed_saga, load_reliability_policies
from tests.reliability.history import Acknowledged, check_events, check_history
from tests.support.processes import FAST_ENGINE, Reply, dump_worker_logs, wait_for

pytestmark = pytest.mark.timeout(150)

LEASE_S = float(FAST_ENGINE["SAGA_STEP_LEASE_S"])
SWEEP_S = float(FAST_ENGINE["SAGA_SWEEP_INTERVAL_S"])
SETTLED = (Unwind.Status.COMPLETED, Unwind.Status.FAILED, Unwind.Status.PAUSED)


def _settled(unwind_ids: list[str]) -> bool:
    return Unwind.objects.filter(pk__in=unwind_ids, status__in=SETTLED).count() == len(unwind_ids)


def _wait_settled(unwind_ids: list[str], workers: list, timeout: float) -> None:
    try:
        wait_for(
            lambda: _settled(unwind_ids),
            timeout=timeout,
            interval=0.2,
            what=f"unwinds {unwind_ids} to settle",
        )
    except AssertionError as exc:
        states = [
            (s.unwind_id, s.position, s.status, s.attempts, s.job_id)
            for s in UnwindStep.objects.filter(unwind_id__in=unwind_ids).order_by("unwind_id", "position")
        ]
        raise AssertionError(f"{exc}\nsteps: {states}\n{dump_worker_logs(workers[-2:])}") from exc


def _rq_worker_names() -> set[str]:
    import django_rq
    from rq import Worker as RqWorker

    return {w.name for w in RqWorker.all(connection=django_rq.get_connection("compensations"))}


def _done_order(run) -> list[str]:
    return list(
        Event.objects.filter(run=run, kind="step.done")
        .order_by("id")
        .values_list("data__action_id", flat=True)
    )


def test_scenario_1_sigkill_mid_compensator_call(tenant, agent, alice, hooks, start_worker, workers, results):
    """Pass: the worker's whole process group is SIGKILLed while the newest step's webhook call is
    in flight (the tool holds the request open); a new worker finishes that step within lease +
    sweep interval of whichever comes later, the lease expiring or the new worker being up (plus
    the job and the call: 2 s, or twice what the first attempt's took, on a machine busy enough
    that this is more); the tool saw the same Idempotency-Key on both attempts; each
    action's effect happened exactly once; steps completed newest action first."""
    load_reliability_policies(hooks=hooks)
    held = threading.Event()
    hooks.script[UNDO_PATH] = [Reply(200, {"state": "too late"}, block=held)]
    saga = failed_saga(tenant, agent, steps=3)
    start_worker()
    wait_for(_rq_worker_names, timeout=60, what="the worker to register")

    started_at = time.monotonic()
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo it all")
    wait_for(lambda: hooks.calls_to(UNDO_PATH), timeout=30, what="the first webhook call")
    # From a queued step to its call on this machine, now: the retry's job does the same work, and
    # other processes (a parallel run's other workers) may be slowing it down.
    job_s = max(2.0, 2 * (time.monotonic() - started_at))
    before = _rq_worker_names()
    workers[0].kill_hard()
    killed_at = time.monotonic()
    held.set()
    step = unwind.steps.get(position=0)
    assert step.status == UnwindStep.Status.RUNNING  # nobody is left to record the outcome
    lease_left = max(0.0, (step.lease_expires_at - step.updated_at).total_seconds())

    start_worker()
    wait_for(lambda: _rq_worker_names() - before, timeout=30, what="the new worker to register")
    ready_at = time.monotonic()
    bound = max(killed_at + lease_left, ready_at) + SWEEP_S + job_s
    wait_for(
        lambda: UnwindStep.objects.get(pk=step.pk).status == UnwindStep.Status.DONE,
        timeout=max(1.0, bound - time.monotonic()),
        interval=0.05,
        what=f"step {step.pk} to finish within lease + sweep",
    )
    recovered_in = time.monotonic() - killed_at
    _wait_settled([unwind.pk], workers, timeout=30)

    calls = hooks.calls_to(UNDO_PATH)
    first_two = [c for c in calls if c.body["step_id"] == step.pk]
    assert [c.body["attempt"] for c in first_two] == [1, 2]
    assert len({c.key for c in first_two}) == 1
    assert all(c.signature_ok for c in calls)
    assert dict(hooks.effects) == {a.pk: 1 for a in saga.actions}
    assert _done_order(saga.run) == [a.pk for a in reversed(saga.actions)]
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.COMPLETED
    report = check_history()
    assert report.violations == []
    results.record(
        "1-sigkill-mid-call",
        faults_injected=1,
        unwinds_completed=1,
        duplicates_observed=0,
        lost_intents=report.lost,
        server_errors=0,
        recovered_in_s=round(recovered_in, 2),
        bound_s=round(bound - killed_at, 2),
    )


def test_scenario_2_crash_between_effect_and_commit(
    tenant, agent, alice, start_worker, workers, tmp_path, results
):
    """Pass: a Python compensator performs its side effect and then SIGKILLs its own process before
    the outcome is committed, on every step; each step is retried with the same idempotency key,
    the retry is absorbed (one effect per action in the tool's log), and the unwind completes in
    LIFO order."""
    effects_dir = tmp_path / "effects"
    effects_dir.mkdir()
    load_reliability_policies(python_undo="tests.reliability.compensators.crash_after_effect")
    saga = failed_saga(tenant, agent, steps=2)
    start_worker(SAGA_RELIABILITY_EFFECTS_DIR=str(effects_dir))

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo it")
    _wait_settled([unwind.pk], workers, timeout=60)

    lines = (effects_dir / "effects.log").read_text().splitlines()
    per_action = {}
    for line in lines:
        action_id, _key = line.split()
        per_action[action_id] = per_action.get(action_id, 0) + 1
    assert per_action == {a.pk: 1 for a in saga.actions}
    steps = list(unwind.steps.order_by("position"))
    assert [(s.status, s.attempts) for s in steps] == [("done", 2), ("done", 2)]
    assert Event.objects.filter(run=saga.run, kind="step.lease_expired").count() == 2
    assert _done_order(saga.run) == [a.pk for a in reversed(saga.actions)]
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.COMPLETED
    report = check_history()
    assert report.violations == []
    results.record(
        "2-crash-before-commit",
        faults_injected=2,
        unwinds_completed=1,
        duplicates_observed=0,
        lost_intents=report.lost,
        server_errors=0,
    )


def test_scenario_4_and_9_worker_restart_loop_then_history_check(
    tenant, agent, alice, hooks, start_worker, workers, results
):
    """Pass: while several long unwinds run, workers are SIGKILLed and replaced in a loop for a
    bounded time (sometimes the replacement starts before the kill, so two workers compete);
    afterwards every unwind ends completed, or failed/paused with an open recovery item (waiting
    for a human); the tool never saw two overlapping calls with one key (no step ran twice
    concurrently); every action's effect happened once; and the history checker finds no
    duplicate, no out-of-order compensation, no acknowledged write missing and an intact chain."""
    load_reliability_policies(hooks=hooks, max_attempts=10)
    hooks.default_delay_s = 0.3  # long enough that kills land mid-call, shorter than the lease
    sagas = [failed_saga(tenant, agent, steps=3) for _ in range(3)]
    acknowledged = [Acknowledged("run.created", s.run.pk) for s in sagas]
    acknowledged += [Acknowledged("action.recorded", a.pk) for s in sagas for a in s.actions]
    start_worker()
    unwinds = []
    for saga in sagas:
        unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo all")
        unwinds.append(unwind)
        acknowledged.append(Acknowledged("unwind.started", unwind.pk))

    rng = random.Random(7)
    kills = 0
    loop_ends = time.monotonic() + 20
    while time.monotonic() < loop_ends and not _settled([u.pk for u in unwinds]):
        time.sleep(rng.uniform(1.0, 3.0))  # the fault schedule itself, not a wait for a condition
        victim = workers[-1]
        if rng.random() < 0.4:
            start_worker()
            victim.kill_hard()
        else:
            victim.kill_hard()
            start_worker()
        kills += 1
    _wait_settled([u.pk for u in unwinds], workers, timeout=90)

    for unwind in Unwind.objects.filter(pk__in=[u.pk for u in unwinds]):
        if unwind.status != Unwind.Status.COMPLETED:
            assert RecoveryItem.objects.filter(run_id=unwind.run_id).exclude(status="resolved").exists(), (
                unwind
            )
    completed = Unwind.objects.filter(pk__in=[u.pk for u in unwinds], status=Unwind.Status.COMPLETED).count()
    assert hooks.overlaps == 0
    assert all(count == 1 for count in hooks.effects.values()), hooks.effects
    assert all(c.signature_ok for c in hooks.calls)
    report = check_history(acknowledged=acknowledged)
    assert report.violations == []
    assert report.compensations == len(hooks.effects)
    assert kills >= 5
    results.record(
        "4-restart-loop",
        faults_injected=kills,
        unwinds_completed=completed,
        unwinds=len(unwinds),
        steps_compensated=report.compensations,
        webhook_calls=len(hooks.calls),
        duplicates_observed=hooks.overlaps + report.duplicates,
        lost_intents=report.lost,
        server_errors=0,
    )
    results.record(
        "9-history-check",
        events_checked=report.events,
        runs_checked=report.runs_checked,
        acknowledged_writes=len(acknowledged),
        duplicates_observed=report.duplicates,
        lost_intents=report.lost,
        chain_intact=not any(v.startswith("chain") for v in report.violations),
        server_errors=0,
    )


class _E:
    def __init__(self, id, kind, run_id="run_a", subject_id="", data=None):  # noqa: A002
        self.id, self.kind, self.run_id, self.subject_id, self.data = id, kind, run_id, subject_id, data or {}


def test_the_history_checker_catches_duplicates_disorder_and_lost_writes():
    """Pass: the checker reports a second compensation of one action, a run compensated oldest
    first, and an acknowledged write with no event; and reports nothing for a sound history."""
    sound = [
        _E(1, "action.succeeded", subject_id="act_1", data={"completion_seq": 1}),
        _E(2, "action.succeeded", subject_id="act_2", data={"completion_seq": 2}),
        _E(3, "step.done", data={"action_id": "act_2"}),
        _E(4, "step.done", data={"action_id": "act_1"}),
    ]
    assert check_events(sound, acknowledged=[Acknowledged("action.succeeded", "act_1")]).violations == []

    broken = [
        *sound[:2],
        _E(3, "step.done", data={"action_id": "act_1"}),
        _E(4, "step.done", data={"action_id": "act_2"}),
        _E(5, "step.done", data={"action_id": "act_2"}),
    ]
    report = check_events(broken, acknowledged=[Acknowledged("run.created", "run_lost")])
    assert report.duplicates == 1 and report.lost == 1
    assert any(v.startswith("order:") for v in report.violations)


@pytest.mark.django_db
def test_the_history_checker_sees_a_broken_chain(tenant, agent):
    """Pass: an event edited behind the append-only trigger's back is reported as a chain break."""
    import pgtrigger

    from ledger.services import runs

    run = runs.run_create(tenant=tenant, actor=agent, agent="x", request="y")
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(run=run).update(reason="forged")
    assert any(v.startswith("chain:") for v in check_history().violations)
