"""A worker job runs an unwind's steps back to back for up to a batch (driven in-process, no
worker): newest first, one step in flight, each step committed before the next call, the unwind
handed back to the queue when the batch is spent, and SQL per step independent of the unwind's
length."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import django_rq
import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rq.job import JobStatus

from infra import errors
from infra.conf import saga
from ledger.audit import Actor, audit_verify
from ledger.models import Action, Event
from ledger.services import runs
from ledger.services.actions import moves
from recovery import compensators, jobs, sweeper
from recovery.actions.approvals import action_record_gated
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.models import Unwind, UnwindStep
from recovery.unwinds.advance import unwind_advance_and_claim
from recovery.unwinds.dispatch import drive_job_timeout
from recovery.unwinds.finish import unwind_finish
from recovery.unwinds.runner import unwind_advance

TOOL = "tests.batch_undo"
calls: list[int] = []
script: list[BaseException | Exception | None] = []


@compensators.compensator(TOOL)
def batch_undo(*, args: dict, **_: object) -> dict:
    calls.append(args["n"])
    effect = script.pop(0) if script else None
    if effect is not None:
        raise effect
    return {"state": "undone"}


@pytest.fixture(autouse=True)
def _fresh_script(db, tmp_path):
    policies = tmp_path / "policies.json"
    policies.write_text(
        json.dumps(
            {
                "policies": [
                    {
                        "tool": "tests.*",
                        "risk": "low",
                        "approval": "auto",
                        "action_class": "internal_update",
                        "compensation": "custom",
                    }
                ]
            }
        )
    )
    call_command("load_policies", str(policies), verbosity=0, stdout=io.StringIO())
    calls.clear()
    script.clear()
    # The tests count the jobs on the queue: none left there by an earlier test of this process.
    django_rq.get_queue("compensations").empty()
    yield
    script.clear()


def _unwind(tenant, agent, alice, *, steps: int) -> Unwind:
    run = runs.run_create(tenant=tenant, actor=agent, agent="batches", request="change things")
    for n in range(steps):
        action = action_record_gated(
            run=run,
            actor=agent,
            tool="tests.change",
            idempotency_key=f"{run.pk}-{n}",
            args={"n": n},
            compensation={"tool": TOOL, "args": {"n": n}},
        ).action
        moves.action_start(action=action, actor=agent)
        moves.action_succeed(action=action, actor=agent)
    item = run_fail_and_queue(run=run, actor=agent, error="boom").item
    assert item is not None
    return unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")


def _statuses(unwind: Unwind) -> list[str]:
    return list(unwind.steps.order_by("position").values_list("status", flat=True))


def test_one_advance_job_runs_every_step_newest_first_and_audits_each(tenant, agent, alice):
    unwind = _unwind(tenant, agent, alice, steps=4)

    jobs.unwind_advance(unwind_id=unwind.pk)

    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.COMPLETED
    assert calls == [3, 2, 1, 0]
    assert _statuses(unwind) == ["done"] * 4
    assert set(Action.objects.filter(run=unwind.run).values_list("status", flat=True)) == {"compensated"}
    # A step claimed by the worker that advanced the unwind never waited for one: pending → running.
    started = Event.objects.filter(run=unwind.run, kind="step.started")
    assert {(e.from_state, e.to_state) for e in started} == {("pending", "running")}
    assert started.count() == 4 and not Event.objects.filter(run=unwind.run, kind="step.queued").exists()
    assert Event.objects.filter(run=unwind.run, kind="step.done").count() == 4
    checked, broken = audit_verify(chain=f"run:{unwind.run_id}")
    assert checked > 0 and broken is None


def test_a_spent_batch_queues_the_next_step_at_the_back_of_the_queue(
    tenant, agent, alice, django_capture_on_commit_callbacks
):
    unwind = _unwind(tenant, agent, alice, steps=3)
    django_rq.get_queue("compensations").empty()

    with django_capture_on_commit_callbacks(execute=True):
        unwind_advance(unwind_id=unwind.pk, batch_s=0)

    assert calls == [2]
    assert _statuses(unwind) == ["done", "queued", "pending"]
    queued = django_rq.get_queue("compensations").jobs
    following = unwind.steps.get(position=1)
    assert [(job.func_name, job.kwargs) for job in queued] == [
        ("recovery.jobs.step_run", {"step_id": following.pk})
    ]
    # The sweeper sees a queued step with a live job (not an idle unwind to advance again).
    assert following.job_id == queued[0].id
    assert queued[0].timeout == drive_job_timeout()
    assert sweeper.sweep().reenqueued == 0 and _statuses(unwind)[1] == "queued"

    jobs.step_run(step_id=following.pk)
    assert calls == [2, 1, 0] and _statuses(unwind) == ["done", "done", "done"]


def test_a_retry_ends_the_batch_and_the_next_step_waits_for_it(tenant, agent, alice):
    unwind = _unwind(tenant, agent, alice, steps=3)
    script.append(ConnectionError("the tool is down"))

    unwind_advance(unwind_id=unwind.pk)

    assert calls == [2]
    step = unwind.steps.get(position=0)
    assert (step.status, step.attempts) == (UnwindStep.Status.QUEUED, 1)
    assert step.next_attempt_at > timezone.now()
    assert _statuses(unwind)[1:] == ["pending", "pending"]


def test_a_worker_dying_mid_batch_leaves_one_leased_step_that_the_sweeper_takes_back(tenant, agent, alice):
    unwind = _unwind(tenant, agent, alice, steps=3)
    # The second step's call never returns (a BaseException is not a compensator's failure: it
    # stands for the process going away mid-call).
    script.extend([None, SystemExit("killed")])

    with pytest.raises(SystemExit):
        unwind_advance(unwind_id=unwind.pk)

    assert _statuses(unwind) == ["done", "running", "pending"]
    lost = unwind.steps.get(position=1)
    assert lost.attempts == 1 and lost.lease_expires_at > timezone.now()
    # Nothing runs two steps at once: while the lease holds, the unwind does not move.
    assert unwind_advance_and_claim(unwind_id=unwind.pk) is None

    UnwindStep.objects.filter(pk=lost.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    report = sweeper.sweep()
    assert report.leases_expired == 1
    jobs.step_run(step_id=lost.pk)

    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.COMPLETED
    assert calls == [2, 1, 1, 0]
    lost.refresh_from_db()
    assert (lost.status, lost.attempts, lost.lease_token) == ("done", 2, 2)


def test_the_first_step_runs_in_the_advance_job_and_a_crash_in_it_is_retaken_by_the_sweeper(
    tenant, agent, alice, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        unwind = _unwind(tenant, agent, alice, steps=1)
    queue = django_rq.get_queue("compensations")
    [advance] = queue.jobs
    unwind.refresh_from_db()
    assert (advance.func_name, unwind.job_id) == ("recovery.jobs.unwind_advance", advance.id)
    script.append(SystemExit("killed"))

    with pytest.raises(SystemExit):
        jobs.unwind_advance(unwind_id=unwind.pk)

    # The advance job claimed the step itself (no job of its own was queued for it) and died in
    # the call: one running step, leased, that nothing else touches while the lease holds.
    step = unwind.steps.get()
    assert (step.status, step.attempts, step.lease_token) == ("running", 1, 1)
    assert sweeper.sweep() == sweeper.SweepReport()
    UnwindStep.objects.filter(pk=step.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    queue.empty()

    with django_capture_on_commit_callbacks(execute=True):
        report = sweeper.sweep()

    assert (report.leases_expired, report.advanced) == (1, 0)
    # The step is handed back with a job of its own (in this test's single transaction the
    # job id is recorded only at the end, so the same sweep may hand it over twice: harmless).
    assert {(job.func_name, job.kwargs["step_id"]) for job in queue.jobs} == {
        ("recovery.jobs.step_run", step.pk)
    }
    jobs.step_run(step_id=step.pk)
    step.refresh_from_db()
    unwind.refresh_from_db()
    assert (step.status, step.attempts, step.lease_token) == ("done", 2, 2)
    assert unwind.status == Unwind.Status.COMPLETED and calls == [0, 0]


def test_the_sweeper_leaves_an_unwind_to_its_advance_job_while_rq_holds_it(
    tenant, agent, alice, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        unwind = _unwind(tenant, agent, alice, steps=2)
    queue = django_rq.get_queue("compensations")
    [advance] = queue.jobs
    # However long the job waits behind other unwinds' jobs, it will run: advancing the unwind
    # here would only queue its step with a second job and leave the first one nothing to do.
    Unwind.objects.filter(pk=unwind.pk).update(updated_at=timezone.now() - timedelta(hours=1))

    assert sweeper.sweep().advanced == 0
    assert [job.id for job in queue.jobs] == [advance.id] and _statuses(unwind) == ["pending", "pending"]

    # A work horse that died before claiming a step leaves its job "started" for good (RQ notices
    # only at its maintenance pass): past three sweep intervals the sweeper stops waiting for it.
    advance.set_status(JobStatus.STARTED)
    advance.started_at = datetime.now(UTC) - timedelta(seconds=1)
    advance.save()
    assert sweeper.sweep().advanced == 0
    advance.started_at = datetime.now(UTC) - timedelta(minutes=5)
    advance.save()

    with django_capture_on_commit_callbacks(execute=True):
        assert sweeper.sweep().advanced == 1

    assert _statuses(unwind) == ["queued", "pending"]
    assert [job.func_name for job in queue.jobs] == ["recovery.jobs.unwind_advance", "recovery.jobs.step_run"]


def test_an_advance_job_a_dead_worker_took_off_the_queue_is_not_waited_for(
    tenant, agent, alice, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        unwind = _unwind(tenant, agent, alice, steps=2)
    queue = django_rq.get_queue("compensations")
    [advance] = queue.jobs
    Unwind.objects.filter(pk=unwind.pk).update(updated_at=timezone.now() - timedelta(hours=1))
    # What RQ's dequeue does first (LMOVE into the queue's intermediate list), then the worker is
    # killed before it marks the job started: the job still reads "queued", but nothing will take
    # it until a worker's maintenance pass fails it, ten minutes or more later.
    queue.connection.lmove(queue.key, queue.intermediate_queue_key)
    assert queue.jobs == [] and advance.get_status() == JobStatus.QUEUED

    # Just taken: its worker may be about to start it.
    assert sweeper.sweep().advanced == 0
    # However long it waited in the queue before: the grace counts from when it was taken off.
    advance.enqueued_at = datetime.now(UTC) - timedelta(minutes=5)
    advance.save()
    assert sweeper.sweep().advanced == 0
    # Taken off five minutes ago (RQ's first-seen mark of its intermediate list) and never started.
    intermediate = queue.intermediate_queue
    queue.connection.set(
        intermediate.get_first_seen_key(advance.id), (datetime.now(UTC) - timedelta(minutes=5)).timestamp()
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert sweeper.sweep().advanced == 1

    assert _statuses(unwind) == ["queued", "pending"]
    assert [job.func_name for job in queue.jobs] == ["recovery.jobs.step_run"]


def test_an_advance_job_gets_a_sweep_interval_to_reach_redis_then_the_sweeper_advances(
    tenant, agent, alice, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        unwind = _unwind(tenant, agent, alice, steps=2)
    # Committed with its job's id, the enqueue not done yet (after a commit that started hundreds
    # of unwinds, the enqueues follow one after another): not a lost job yet.
    unwind.refresh_from_db()
    queue = django_rq.get_queue("compensations")
    assert unwind.job_id and queue.jobs == []
    assert sweeper.sweep().advanced == 0

    # A sweep interval on, the job never arrived (Redis was down, or restarted empty).
    Unwind.objects.filter(pk=unwind.pk).update(
        updated_at=timezone.now() - timedelta(seconds=saga().sweep_interval_s + 1)
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert sweeper.sweep().advanced == 1

    assert _statuses(unwind) == ["queued", "pending"]
    assert [job.func_name for job in queue.jobs] == ["recovery.jobs.step_run"]


def test_a_refused_advance_keeps_the_outcome_of_the_step_that_ran(
    tenant, agent, alice, monkeypatch, django_capture_on_commit_callbacks
):
    unwind = _unwind(tenant, agent, alice, steps=2)
    refusals = []

    def refuse_once(**kwargs):
        if not refusals:
            refusals.append(kwargs)
            raise errors.Conflict("the run left compensating")
        return finish(**kwargs)

    finish = unwind_finish
    # The advance that finds no step left finishes the unwind (recovery.unwinds.advance).
    monkeypatch.setattr("recovery.unwinds.advance.unwind_finish", refuse_once)
    django_rq.get_queue("compensations").empty()

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        unwind_advance(unwind_id=unwind.pk)

    # Both compensations ran and are recorded, although finishing the unwind was refused...
    assert calls == [1, 0] and _statuses(unwind) == ["done", "done"]
    assert len(refusals) == 1
    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.RUNNING
    # ...and the advance is handed to a job of its own, which finishes it. (The other callbacks
    # count the writes and the step outcomes in the metrics once they commit.)
    enqueues = [c for c in callbacks if not _counts_a_metric(c)]
    assert len(enqueues) == 1
    enqueues[0]()
    assert [job.func_name for job in django_rq.get_queue("compensations").jobs] == [
        "recovery.jobs.unwind_advance"
    ]
    jobs.unwind_advance(unwind_id=unwind.pk)
    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.COMPLETED and calls == [1, 0]


def _counts_a_metric(callback) -> bool:
    """An on-commit callback of infra.metrics or recovery.metrics (a counter's inc, or a closure
    of those modules)."""
    owner = getattr(callback, "__self__", None)
    module = type(owner).__module__ if owner is not None else getattr(callback, "__module__", "")
    return module.startswith(("prometheus_client", "infra.metrics", "recovery.metrics"))


def _statements(tenant, agent, alice, steps: int) -> int:
    unwind = _unwind(tenant, agent, alice, steps=steps)
    with CaptureQueriesContext(connection) as captured:
        jobs.unwind_advance(unwind_id=unwind.pk)
    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.COMPLETED
    return len(captured)


def test_statements_per_step_do_not_grow_with_the_unwind(tenant, agent, alice):
    two, four, eight = (_statements(tenant, agent, alice, n) for n in (2, 4, 8))
    per_step = (four - two) / 2
    # Linear in the step count: nothing is looked up once per step of the unwind, per step.
    assert eight - four == 4 * per_step
    # What one step costs: claim, outcome, the action's two transitions and their audit events.
    assert per_step <= 30, per_step
