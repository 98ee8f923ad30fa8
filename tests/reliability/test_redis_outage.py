"""Scenario 3: Redis goes away while operators decide, and comes back empty mid-unwind; the worker
process waits the outage out (never exits), registers again with the Redis that came back empty,
and the worker gauge and probe tell it from a worker that died meanwhile."""

from __future__ import annotations

import threading

import django_rq
import pytest
from django.test import Client
from django.urls import reverse
from rq import Worker as RqWorker
from saga_client.signing import verify_signature

from recovery.metrics import ScrapeCollector
from recovery.models import AgentCommand, Notification, RecoveryItem, Unwind, UnwindStep
from saga_admin import probe
from tests.factories import RESUME_PATH, RESUME_SECRET, UNDO_PATH, failed_saga, load_reliability_policies
from tests.reliability.conftest import RESUME_AGENT_SECRET
from tests.support.api import Api
from tests.support.processes import Reply, Worker, dump_worker_logs, wait_for

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


NOTIFY_PATH, NOTIFY_SECRET = "/notify", "notify-secret"


@pytest.mark.django_db(transaction=True)
def test_scenario_3f_redis_restarted_empty_before_any_worker_took_the_queued_work(
    tenant, agent, operator_key, hooks, redis_server, start_worker, workers, settings
):
    """Pass: the run's "in the recovery queue" notification and an operator's compensate are
    committed and their jobs queued in Redis while no worker runs; Redis restarts empty (the jobs
    are gone); a worker started then delivers the notification (signed, once) and carries the
    unwind out, LIFO, one effect per action: the sweeper handed both to it again from PostgreSQL
    (docs/DEPLOY.md, "Redis")."""
    hooks.secrets[NOTIFY_PATH] = NOTIFY_SECRET
    notify_env = {"SAGA_NOTIFY_WEBHOOKS": hooks.url(NOTIFY_PATH), "SAGA_NOTIFY_WEBHOOK_SECRET": NOTIFY_SECRET}
    settings.SAGA = {
        **settings.SAGA,
        "NOTIFY_WEBHOOKS": [hooks.url(NOTIFY_PATH)],
        "NOTIFY_WEBHOOK_SECRET": NOTIFY_SECRET,
    }
    load_reliability_policies(hooks=hooks)
    saga = failed_saga(tenant, agent, steps=2)
    response = Api(operator_key[1]).post(f"/recovery/{saga.item.pk}/compensate", {"reason": "undo"})
    assert response.status_code == 202
    unwind_id = response.json()["id"]
    notifications = list(Notification.objects.filter(run_id=saga.run.pk).values_list("pk", "job_id"))
    assert notifications and all(job_id for _pk, job_id in notifications)
    connection = django_rq.get_connection("default")
    # The notification's delivery and the unwind's first job, waiting for a worker.
    assert connection.llen("rq:queue:notifications") and connection.llen("rq:queue:compensations")

    redis_server.stop()
    redis_server.start()  # empty: both jobs are gone, the rows in PostgreSQL say what is owed
    assert not connection.exists("rq:queue:notifications", "rq:queue:compensations")
    start_worker(**notify_env)

    try:
        wait_for(lambda: _completed([unwind_id]), timeout=60, interval=0.2, what="the unwind to complete")
        wait_for(
            lambda: (
                not Notification.objects.filter(
                    pk__in=[pk for pk, _job in notifications], status__in=("pending", "sending")
                ).exists()
            ),
            timeout=60,
            what="the notifications to be delivered",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc
    delivered = Notification.objects.filter(pk__in=[pk for pk, _job in notifications])
    assert {row.status for row in delivered} == {"delivered"}
    assert all(
        row.job_id != job_id for row, (_pk, job_id) in zip(delivered.order_by("pk"), sorted(notifications))
    )
    opened = [c for c in hooks.calls_to(NOTIFY_PATH) if c.body.get("event") == "recovery.opened"]
    assert len(opened) == 1 and opened[0].signature_ok
    undone = [(c.body["action_id"], c.body["attempt"]) for c in hooks.calls_to(UNDO_PATH)]
    assert undone == [(a.pk, 1) for a in reversed(saga.actions)]


# --- The worker outlives the outage --------------------------------------------------------------


def _rq_workers_gauge() -> dict[str, float]:
    """``saga_rq_workers`` per queue, as ``GET /metrics`` computes it at a scrape."""
    family = next(f for f in ScrapeCollector().collect() if f.name == "saga_rq_workers")
    return {sample.labels["queue"]: sample.value for sample in family.samples}


def _registered_pids() -> list[int]:
    """The pids of the workers Redis lists (what the worker probe reads)."""
    return sorted(w.pid or 0 for w in RqWorker.all(connection=django_rq.get_connection("default")))


def _counted(workers: list[Worker]) -> bool:
    """Exactly these worker processes are registered, and counted on every queue."""
    pids = sorted(w.process.pid for w in workers)
    return _registered_pids() == pids and set(_rq_workers_gauge().values()) == {float(len(pids))}


@pytest.fixture
def beat_dir(tmp_path, monkeypatch):
    """Workers and the probe (run here, as in the container) share one beat directory."""
    directory = tmp_path / "beats"
    monkeypatch.setenv("SAGA_WORKER_BEAT_DIR", str(directory))
    return directory


@pytest.mark.django_db(transaction=True)
def test_redis_dies_mid_job_and_the_worker_process_waits_it_out(
    tenant, agent, operator_key, hooks, redis_server, start_worker, workers, beat_dir, results
):
    """Pass: Redis is killed while a compensation's call is in flight; the call finishes, the work
    loop then fails on Redis (where rq used to exit the process from register_death); the same
    worker process waits through several retries, registers again with the Redis that came back
    empty, and the unwind completes with one effect per action."""
    load_reliability_policies(hooks=hooks)
    release = threading.Event()
    hooks.script[UNDO_PATH] = [Reply(200, {"state": {"compensated": UNDO_PATH}}, block=release)]
    saga = failed_saga(tenant, agent, steps=2)
    # Periodic jobs every 3 s, not every second: on a loaded machine their queue (served first)
    # would keep the worker from the compensation for longer than the test waits.
    worker = start_worker(SAGA_WORKER_BEAT_DIR=str(beat_dir), SAGA_SWEEP_INTERVAL_S="3")
    wait_for(lambda: _counted([worker]), timeout=60, what="the worker to register")

    response = Api(operator_key[1]).post(f"/recovery/{saga.item.pk}/compensate", {"reason": "undo"})
    assert response.status_code == 202
    unwind_id = response.json()["id"]
    assert hooks.arrived.wait(timeout=30), dump_worker_logs(workers)
    redis_server.stop()
    release.set()
    try:
        wait_for(
            lambda: UnwindStep.objects.filter(unwind_id=unwind_id, position=0, status="done").exists(),
            timeout=30,
            what="the in-flight step to commit in PostgreSQL",
        )
        # The work loop met the outage, and the process waited through more than one retry.
        wait_for(
            lambda: (
                worker.process.poll() is not None or worker.log().count("Redis still does not answer") >= 2
            ),
            timeout=40,
            what="the worker to wait for Redis",
        )
        assert worker.process.poll() is None, "the worker process exited during the Redis outage"
        assert probe.probe_worker(480) is None  # alive and waiting: the probe does not call it dead

        redis_server.start()  # empty
        wait_for(lambda: _completed([unwind_id]), timeout=60, interval=0.2, what="the unwind to complete")
        wait_for(lambda: _counted([worker]), timeout=30, what="the same worker to be registered again")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc
    assert worker.process.poll() is None
    assert dict(hooks.effects) == {a.pk: 1 for a in saga.actions}
    results.record(
        "3c-redis-killed-mid-job",
        faults_injected=1,
        unwinds_completed=1,
        worker_exits=0,
        duplicates_observed=0,
        lost_intents=0,
        server_errors=0,
    )


@pytest.mark.django_db(transaction=True)
def test_after_redis_comes_back_empty_the_gauge_and_probe_count_the_live_worker_not_the_dead(
    redis_server, start_worker, workers, beat_dir
):
    """Pass: of two workers one is SIGKILLed; Redis restarts empty; ``saga_rq_workers`` and the
    registry the probe reads count the live one again within seconds (rq's own heartbeat recreated
    only the worker's hash, so the gauge said 0 for minutes), never the dead one. The same after a
    flush that keeps the workers' connections open. While Redis is down the probe says healthy for
    the live worker's container and unhealthy once no worker process is left."""
    live = start_worker(SAGA_WORKER_BEAT_DIR=str(beat_dir))
    doomed = start_worker(SAGA_WORKER_BEAT_DIR=str(beat_dir))
    try:
        wait_for(lambda: _counted([live, doomed]), timeout=60, what="both workers to register")
        doomed.kill_hard()

        redis_server.stop()
        assert probe.probe_worker(480) is None
        redis_server.start()  # empty
        wait_for(lambda: _counted([live]), timeout=20, what="the live worker alone to be counted again")
        assert probe.probe_worker(480) is None

        redis_server.flush()  # gone again, with the worker blocked on its open connection
        assert _rq_workers_gauge() == {"default": 0.0, "compensations": 0.0, "notifications": 0.0}
        wait_for(lambda: _counted([live]), timeout=20, what="the live worker to register after a flush")

        live.kill_hard()
        redis_server.stop()
        problem = probe.probe_worker(480)
        assert problem and "Redis did not answer" in problem
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs(workers)}") from exc
