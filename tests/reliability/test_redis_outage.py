"""Scenario 3: Redis goes away while operators decide, and comes back empty mid-unwind."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from saga_client.signing import verify_signature

from recovery.models import AgentCommand, RecoveryItem, Unwind, UnwindStep
from tests.factories import RESUME_PATH, RESUME_SECRET, UNDO_PATH, failed_saga, load_reliability_policies
from tests.reliability.conftest import RESUME_AGENT_SECRET
from tests.support.api import Api
from tests.support.processes import Reply, dump_worker_logs, wait_for

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def cache_on_throwaway_redis(settings, redis_server):
    """The API's throttle counts live in Redis too: take them down with it, as in production."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_server.url,
            "KEY_PREFIX": "saga",
        }
    }


def _completed(unwind_ids: list[str]) -> bool:
    return Unwind.objects.filter(pk__in=unwind_ids, status=Unwind.Status.COMPLETED).count() == len(unwind_ids)


@pytest.mark.django_db(transaction=True)
def test_scenario_3_decisions_while_redis_is_down(
    tenant,
    agent,
    alice,
    operator_key,
    hooks,
    redis_server,
    start_worker,
    workers,
    cache_on_throwaway_redis,
    results,
):
    """Pass: with Redis stopped, compensate (API and dashboard), resume (API, with a resume_url) and
    close (dashboard and API) each answer without a 5xx and commit their decision in PostgreSQL;
    nothing reaches the tools while Redis is down; once Redis is back (empty) the two unwinds
    complete in LIFO order with one effect per action, and the resume command is pushed, signed
    so the receiver verifies it with saga_client.signing.verify_signature."""
    load_reliability_policies(hooks=hooks)
    api_comp, ui_comp, api_resume, ui_close, api_close = (
        failed_saga(tenant, agent, steps=2, resume_url=hooks.url(RESUME_PATH) if n == 2 else "")
        for n in range(5)
    )
    start_worker()
    redis_server.stop()

    api = Api(operator_key[1])
    dashboard = Client()
    dashboard.force_login(alice)
    responses = [
        api.post(f"/recovery/{api_comp.item.pk}/compensate", {"reason": "redis down, undo"}),
        dashboard.post(
            reverse("dashboard:item-compensate", args=[ui_comp.item.pk]), {"reason": "undo from ui"}
        ),
        api.post(f"/recovery/{api_resume.item.pk}/resume", {"reason": "carry on"}),
        dashboard.post(reverse("dashboard:item-close", args=[ui_close.item.pk]), {"reason": "close from ui"}),
        api.post(f"/recovery/{api_close.item.pk}/close", {"reason": "close from api"}),
    ]
    statuses = [r.status_code for r in responses]
    assert statuses == [202, 303, 202, 303, 200], [(r.status_code, r.content[:300]) for r in responses]

    unwind_ids = list(Unwind.objects.filter(run__in=[api_comp.run, ui_comp.run]).values_list("pk", flat=True))
    assert len(unwind_ids) == 2
    resolutions = dict(
        RecoveryItem.objects.filter(run__in=[api_resume.run, ui_close.run, api_close.run]).values_list(
            "run_id", "resolution"
        )
    )
    assert resolutions == {
        api_resume.run.pk: "resumed",
        ui_close.run.pk: "closed",
        api_close.run.pk: "closed",
    }
    command = AgentCommand.objects.get(run=api_resume.run)
    assert command.delivered_at is None
    assert hooks.calls == []

    redis_server.start()  # empty: whatever was queued before the outage is gone
    try:
        wait_for(lambda: _completed(unwind_ids), timeout=60, interval=0.2, what="both unwinds to complete")
        wait_for(
            lambda: AgentCommand.objects.get(pk=command.pk).delivered_at,
            timeout=30,
            what="the resume command to be pushed",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc
    undo_effects = {key: count for key, count in hooks.effects.items() if key != RESUME_PATH}
    assert undo_effects == {a.pk: 1 for s in (api_comp, ui_comp) for a in s.actions}
    pushed = hooks.calls_to(RESUME_PATH)
    assert pushed and all(verify_signature(RESUME_AGENT_SECRET, c.headers, c.raw) for c in pushed)
    assert not verify_signature(RESUME_SECRET, pushed[0].headers, pushed[0].raw)
    server_errors = sum(1 for s in statuses if s >= 500)
    results.record(
        "3a-decisions-redis-down",
        decisions=len(responses),
        committed=len(responses),
        faults_injected=1,
        unwinds_completed=len(unwind_ids),
        duplicates_observed=0,
        lost_intents=0,
        server_errors=server_errors,
    )


@pytest.mark.django_db(transaction=True)
def test_scenario_3_redis_restarted_empty_mid_unwind(
    tenant, agent, alice, operator_key, hooks, redis_server, start_worker, workers, results
):
    """Pass: the newest step's first call fails (503) so its retry waits in Redis as a scheduled
    job; Redis is restarted with its data flushed; the sweeper finds the queued step whose job is
    gone, enqueues it again from PostgreSQL, and the unwind completes, LIFO, one effect per action."""
    load_reliability_policies(hooks=hooks)
    hooks.script[UNDO_PATH] = [Reply(503, {"error": "busy"})]
    saga = failed_saga(tenant, agent, steps=3)
    start_worker(SAGA_RETRY_BACKOFF_BASE_S="3", SAGA_RETRY_BACKOFF_MAX_S="3")

    response = Api(operator_key[1]).post(f"/recovery/{saga.item.pk}/compensate", {"reason": "undo"})
    assert response.status_code == 202
    unwind_id = response.json()["id"]
    step = wait_for(
        lambda: (
            UnwindStep.objects.filter(unwind_id=unwind_id, position=0, status="queued", attempts=1)
            .exclude(job_id="")
            .first()
        ),
        timeout=30,
        what="the retry to be scheduled in Redis",
    )
    scheduled_job = step.job_id
    redis_server.stop()
    redis_server.start()

    try:
        wait_for(lambda: _completed([unwind_id]), timeout=60, interval=0.2, what="the unwind to complete")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc
    step.refresh_from_db()
    assert step.status == "done" and step.attempts == 2
    assert step.job_id != scheduled_job  # the sweeper's job, not the one Redis lost
    newest, middle, oldest = reversed(saga.actions)
    # LIFO: the newest step's refused call and its retry (the sweeper's job), then each older once.
    calls = [(c.body["action_id"], c.body["attempt"]) for c in hooks.calls_to(UNDO_PATH)]
    assert calls == [(newest.pk, 1), (newest.pk, 2), (middle.pk, 1), (oldest.pk, 1)]
    assert dict(hooks.effects) == {a.pk: 1 for a in saga.actions}
    results.record(
        "3b-redis-flushed-mid-unwind",
        faults_injected=1,
        unwinds_completed=1,
        jobs_rebuilt=1,
        duplicates_observed=0,
        lost_intents=0,
        server_errors=0,
    )
