"""The unwind engine end to end: real PostgreSQL, a real (throwaway) Redis, real `saga_worker`
processes, and compensating tools served over signed webhooks by a test HTTP server."""

from __future__ import annotations

import threading
import time
from collections import Counter

import django_rq
import pytest
from django.db import transaction
from rq.job import Job

from ledger.audit import Actor
from ledger.models import Action, Event, Run
from recovery.actions.approvals import approval_approve
from recovery.actions.compensations import step_skip, unwind_start
from recovery.models import Approval, RecoveryItem, Unwind, UnwindStep
from tests.factories import HR_PATH, WS_PATH, load_onboarding_policies, onboarding_saga
from tests.support.processes import Reply, dump_worker_logs, wait_for, work_under_way

# Real saga_worker processes carrying unwinds out: the slow lane (`make test-fast` leaves it out).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def _finished(unwind: Unwind) -> Unwind | None:
    unwind.refresh_from_db()
    return unwind if unwind.status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED) else None


def _wait_finished(unwind: Unwind, workers: list, timeout: float = 30) -> Unwind:
    try:
        return wait_for(
            lambda: _finished(unwind),
            timeout=timeout,
            what=f"unwind {unwind.pk} to finish",
            progress=work_under_way(*(worker.log_path for worker in workers)),
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc


def test_it_compensates_the_onboarding_saga_in_lifo_order_through_signed_webhooks(
    tenant, agent, alice, webhooks, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    saga = onboarding_saga(tenant, agent)
    worker = start_worker()

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="new hire withdrew")
    _wait_finished(unwind, [worker])

    assert unwind.status == Unwind.Status.COMPLETED
    calls = webhooks.calls
    # LIFO: the license (completed second) is cancelled before the user (completed first) is deleted.
    assert [c.path for c in calls] == [WS_PATH, HR_PATH]
    assert all(c.signature_ok for c in calls)
    license_call = calls[0]
    steps = list(unwind.steps.order_by("position"))
    assert license_call.headers["Idempotency-Key"] == steps[0].idempotency_key
    assert license_call.body == {
        "step_id": steps[0].pk,
        "action_id": saga.provision_license.pk,
        "run_id": saga.run.pk,
        "tenant": "acme",
        "tool": "workspace.cancel_license",
        "args": {"email": "ashu@company.com"},
        "target_type": "user",
        "target_id": "ashu@company.com",
        "before_snapshot": {"license": None},
        "after_snapshot": {"license": "business-standard"},
        "attempt": 1,
    }
    assert {s.status for s in steps} == {UnwindStep.Status.DONE}
    # The tool's {"state": …} answer is kept as the post-compensation snapshot.
    assert steps[0].result == {"compensated": WS_PATH}
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATED
    item = RecoveryItem.objects.get(pk=saga.item.pk)
    assert (item.status, item.resolution, item.resolved_by) == ("resolved", "compensated", alice)
    statuses = dict(Action.objects.filter(run=saga.run).values_list("tool", "status"))
    assert statuses == {
        "hr.create_user": "compensated",
        "workspace.provision_license": "compensated",
        "email.send_welcome": "failed",
    }


def test_unwinds_started_together_cost_one_job_each_however_long_they_wait(
    tenant, agent, alice, webhooks, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    # Four unwinds of two 0.3 s steps on one worker: the last waits behind ~2 s of calls, longer
    # than the sweep interval (1 s here), so sweeps run while advance jobs are still queued. The
    # batch is long enough that no job hands its unwind on (a loaded machine can take longer than
    # the default 2 s for two steps, and the hand-over is a step_run job by design): every
    # step_run seen would be the sweeper's.
    webhooks.default_delay_s = 0.3
    sagas = [onboarding_saga(tenant, agent, email=f"hire{i}@company.com") for i in range(4)]
    worker = start_worker(SAGA_UNWIND_BATCH_S="60")

    with transaction.atomic():
        started = [
            unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="hiring paused")
            for saga in sagas
        ]
    for unwind in started:
        _wait_finished(unwind, [worker])

    assert {unwind.status for unwind in started} == {Unwind.Status.COMPLETED}
    assert len(webhooks.calls) == 8 and sum(webhooks.effects.values()) == 8
    # Each unwind's advance job ran both its steps: the sweeper did not hand a waiting unwind's
    # step to a second job.
    queue = django_rq.get_queue("compensations")
    ran = Counter(
        Job.fetch(job_id, connection=queue.connection).func_name
        for job_id in queue.finished_job_registry.get_job_ids()
    )
    assert ran == {"recovery.jobs.unwind_advance": 4}


def test_it_retries_a_compensator_that_fails_twice_then_succeeds(
    tenant, agent, alice, webhooks, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    webhooks.script[WS_PATH] = [
        Reply(503, {"error": "busy"}),
        Reply(502),
        Reply(200, {"state": {"license": None}}),
    ]
    saga = onboarding_saga(tenant, agent)
    worker = start_worker()

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="withdrawn")
    _wait_finished(unwind, [worker])

    license_calls = webhooks.calls_to(WS_PATH)
    assert [c.body["attempt"] for c in license_calls] == [1, 2, 3]
    assert len({c.headers["Idempotency-Key"] for c in license_calls}) == 1
    step = unwind.steps.get(position=0)
    assert (step.status, step.attempts, step.result) == ("done", 3, {"license": None})
    # Exponential backoff between attempts (0.2 s, then 0.4 s).
    assert license_calls[2].at - license_calls[1].at >= 0.35
    assert unwind.status == Unwind.Status.COMPLETED
    assert Event.objects.filter(run=saga.run, kind="step.retry_scheduled").count() == 2


def test_a_412_leaves_the_step_drifted_and_the_item_open_until_an_operator_decides(
    tenant, agent, alice, webhooks, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    webhooks.script[HR_PATH] = [Reply(412, {"error": "user was edited since"})]
    saga = onboarding_saga(tenant, agent)
    worker = start_worker()

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="withdrawn")
    _wait_finished(unwind, [worker])

    # alert_and_continue: the license was still cancelled; the drifted user deletion waits for a human.
    assert unwind.status == Unwind.Status.FAILED
    license_step, user_step = unwind.steps.order_by("position")
    assert (license_step.status, user_step.status) == ("done", "drifted")
    assert user_step.attempts == 1  # a drift is never retried automatically
    item = RecoveryItem.objects.get(run=saga.run, status=RecoveryItem.Status.OPEN)
    assert item.reason == RecoveryItem.Reason.STATE_DRIFT and item.reopened_count == 1
    assert [entry["tool"] for entry in item.details["left"]] == ["hr.delete_user"]
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.FAILED
    assert Action.objects.get(pk=saga.create_user.pk).status == Action.Status.COMPENSATION_FAILED

    # The operator looks and leaves the user in place: the unwind settles and the run is done.
    step_skip(step=user_step, actor=Actor.for_user(alice), reason="HR keeps the edited record")
    wait_for(
        lambda: Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.COMPLETED,
        timeout=20,
        what="the unwind to settle after the skip",
    )
    item.refresh_from_db()
    assert (item.status, item.resolution) == ("resolved", "compensated")
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATED


def test_a_worker_killed_mid_step_is_recovered_by_the_sweeper_with_the_same_idempotency_key(
    tenant, agent, alice, webhooks, start_worker
):
    load_onboarding_policies(webhooks=webhooks)
    held = threading.Event()
    webhooks.script[WS_PATH] = [Reply(200, {"state": "too late"}, block=held)]
    saga = onboarding_saga(tenant, agent)
    first = start_worker()

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="withdrawn")
    wait_for(lambda: webhooks.calls_to(WS_PATH), timeout=20, what="the first webhook call")
    first.kill_hard()  # mid-step: the compensator call is in flight
    held.set()
    step = unwind.steps.get(position=0)
    assert step.status == UnwindStep.Status.RUNNING  # nobody is left to record the outcome

    second = start_worker()
    _wait_finished(unwind, [first, second])

    license_calls = webhooks.calls_to(WS_PATH)
    assert len(license_calls) == 2
    assert license_calls[0].headers["Idempotency-Key"] == license_calls[1].headers["Idempotency-Key"]
    assert [c.body["attempt"] for c in license_calls] == [1, 2]
    step.refresh_from_db()
    assert (step.status, step.attempts, step.lease_token) == ("done", 2, 2)
    assert Event.objects.filter(run=saga.run, kind="step.lease_expired", subject_id=step.pk).exists()
    assert unwind.status == Unwind.Status.COMPLETED


def test_an_unwind_requested_while_redis_is_down_is_committed_and_completes_when_redis_returns(
    tenant, agent, alice, webhooks, start_worker, redis_server
):
    load_onboarding_policies(webhooks=webhooks)
    saga = onboarding_saga(tenant, agent)
    worker = start_worker()
    redis_server.stop()

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="withdrawn")

    # The decision is safe in PostgreSQL even though no job could be queued.
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.RUNNING
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATING
    time.sleep(1.5)
    assert webhooks.calls == []

    redis_server.start()  # empty: whatever was in Redis is gone
    _wait_finished(unwind, [worker], timeout=40)
    assert unwind.status == Unwind.Status.COMPLETED
    assert [c.path for c in webhooks.calls] == [WS_PATH, HR_PATH]


def test_an_approval_gated_step_pauses_the_unwind_until_a_second_person_approves(
    tenant, agent, alice, bob, webhooks, start_worker
):
    # A critical license: undoing it needs an approval, from someone other than who asked.
    load_onboarding_policies(webhooks=webhooks, license_risk="critical")
    saga = onboarding_saga(tenant, agent)
    worker = start_worker()

    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="withdrawn")
    approval = wait_for(
        lambda: Approval.objects.filter(step__unwind=unwind, status="pending").first(),
        timeout=20,
        what="the step's approval request",
    )
    assert (approval.kind, approval.risk, approval.tool, approval.requested_by) == (
        "compensation",
        "critical",
        "workspace.cancel_license",
        alice,
    )
    time.sleep(1.5)
    unwind.refresh_from_db()
    assert unwind.status == Unwind.Status.PAUSED
    assert webhooks.calls == []  # LIFO: nothing after the gated step runs either

    from infra import errors

    with pytest.raises(errors.SelfApproval):
        approval_approve(approval=approval, actor=Actor.for_user(alice), reason="my own request")
    approval_approve(
        approval=approval,
        actor=Actor.for_user(bob),
        reason="checked with HR",
        args={"email": "ashu@company.com", "refund": "prorated"},
    )

    _wait_finished(unwind, [worker])
    assert unwind.status == Unwind.Status.COMPLETED
    assert [c.path for c in webhooks.calls] == [WS_PATH, HR_PATH]
    # The approved (edited) args are what ran.
    assert webhooks.calls[0].body["args"] == {"email": "ashu@company.com", "refund": "prorated"}


def test_a_low_risk_failure_is_compensated_without_a_human(tenant, agent, webhooks, start_worker):
    load_onboarding_policies(webhooks=webhooks, auto_compensate="medium")
    worker = start_worker()
    saga = onboarding_saga(tenant, agent)

    unwind = Unwind.objects.get(run=saga.run)
    assert unwind.automatic and saga.item.status == RecoveryItem.Status.CLAIMED
    _wait_finished(unwind, [worker])

    item = RecoveryItem.objects.get(pk=saga.item.pk)
    assert (item.status, item.resolution) == ("resolved", "auto_compensated")
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.COMPENSATED
    assert [c.path for c in webhooks.calls] == [WS_PATH, HR_PATH]
