"""Undo keeps up: a real ``saga_worker`` takes an unwind step before any backlog of
housekeeping, and says in its log, as structured events, every compensation step that did not end
well; RQ's per-job lines stay out of it unless asked for."""

from __future__ import annotations

import json

import django_rq
import pytest

from ledger.audit import Actor
from recovery.actions.compensations import unwind_start
from recovery.models import Unwind, UnwindStep
from tests.factories import HR_PATH, WS_PATH, load_onboarding_policies, onboarding_saga
from tests.support.processes import Reply, dump_worker_logs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]

BACKLOG = 150


def _finished(unwind: Unwind, workers: list, timeout: float = 60) -> Unwind:
    def done() -> Unwind | None:
        unwind.refresh_from_db()
        return unwind if unwind.status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED) else None

    try:
        return wait_for(done, timeout=timeout, what=f"unwind {unwind.pk} to finish")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc


def test_an_unwind_step_is_taken_before_a_deep_backlog_of_housekeeping(
    tenant, agent, alice, webhooks, own_redis, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    saga = onboarding_saga(tenant, agent)
    # The soak's shape: far more periodic-type jobs waiting on ``default`` than one worker gets
    # through in the time an unwind takes (the ticker no longer enqueues these: an older worker,
    # or an operator's bulk, can still fill the queue).
    default = django_rq.get_queue("default")
    for _ in range(BACKLOG):
        default.enqueue("recovery.jobs.notifications_sweep")
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="new hire withdrew")
    worker = start_worker()

    _finished(unwind, [worker])

    assert unwind.status == Unwind.Status.COMPLETED
    # Both steps ran while (nearly) the whole backlog still waited: decisions are served first.
    assert default.count >= BACKLOG - 5, dump_worker_logs([worker])
    # And the backlog is not starved either: it drains once the decisions are done.
    wait_for(lambda: default.count == 0, timeout=60, what="the housekeeping backlog to drain")


def _events(worker) -> list[dict]:
    found = []
    for line in worker.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


def test_every_retried_given_up_and_drifted_step_is_one_structured_warning(
    tenant, agent, alice, webhooks, own_redis, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    # The licence's compensator is down for good (five attempts: four retries, then given up);
    # the user's answers 412 (the record changed since: drifted).
    webhooks.script[WS_PATH] = [Reply(503, {"error": "busy"}) for _ in range(5)]
    webhooks.script[HR_PATH] = [Reply(412, {"error": "user was edited since"})]
    saga = onboarding_saga(tenant, agent)
    worker = start_worker()

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="withdrawn")
    _finished(unwind, [worker])

    licence, user = unwind.steps.order_by("position")
    assert (licence.status, user.status) == (UnwindStep.Status.FAILED, UnwindStep.Status.DRIFTED)
    records = _events(worker)
    said = [r for r in records if str(r.get("event", "")).startswith("unwinds.step_")]
    assert [(r["event"], r["step_id"], r["attempt"]) for r in said if r["step_id"] == licence.pk] == [
        ("unwinds.step_retried", licence.pk, 1),
        ("unwinds.step_retried", licence.pk, 2),
        ("unwinds.step_retried", licence.pk, 3),
        ("unwinds.step_retried", licence.pk, 4),
        ("unwinds.step_given_up", licence.pk, 5),
    ], dump_worker_logs([worker])
    assert [(r["event"], r["attempt"]) for r in said if r["step_id"] == user.pk] == [
        ("unwinds.step_drifted", 1)
    ]
    for record in said:
        assert record["level"] in ("warning", "error")
        assert record["run_id"] == saga.run.pk and record["unwind_id"] == unwind.pk
        assert record["tool"] in ("workspace.cancel_license", "hr.delete_user")
        assert record["reason"]
    assert "503" in said[0]["reason"] and said[-1]["level"] == "error"
    # RQ's own per-job lines are not in the log unless asked for (-v 2, RQ_LOG_LEVEL=INFO).
    assert not [r for r in records if r.get("logger", "").startswith("rq") and r.get("level") == "info"]


def test_a_job_run_in_the_worker_process_keeps_a_hard_timeout_and_leaks_nothing(own_redis, start_worker):
    from rq.job import JobStatus

    from tests.support import worker_jobs

    notifications = django_rq.get_queue("notifications")
    stuck = notifications.enqueue(worker_jobs.hang, 600, job_timeout=1)
    leaving = notifications.enqueue(worker_jobs.bind_and_leave, leak="from-the-last-job")
    seen = notifications.enqueue(worker_jobs.context_seen)
    worker = start_worker()

    def finished(job):
        status = job.get_status(refresh=True)
        return status if status in (JobStatus.FINISHED, JobStatus.FAILED) else None

    # The stuck call is cut at its timeout (SIGALRM in the worker's own process), not waited for.
    assert wait_for(lambda: finished(stuck), timeout=30, what="the stuck job to time out") == JobStatus.FAILED
    assert "JobTimeoutException" in (stuck.latest_result().exc_string or ""), dump_worker_logs([worker])
    wait_for(lambda: finished(seen), timeout=30, what="the jobs after it")
    # Both ran in the worker's own process (no horse), and the second saw nothing of the first.
    assert leaving.return_value() == seen.return_value()["pid"] == worker.process.pid
    assert seen.return_value()["context"] == {}
