"""``GET /metrics`` from a live deployment: the Procfile's web line (gunicorn, two worker
processes, its hooks) and a real ``saga_worker``, sharing one metrics directory as processes of
one host do. Traffic goes through the web (an agent records actions) and through the worker (an
unwind's steps call a compensating service); one scrape of the web shows both, added up, and
every metric the alert rules and the Grafana dashboard under deploy/ select. Every scrape, of
the web and of a worker's own port, passes Debian's ``promtool check metrics`` with no finding."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict

from ledger.audit import Actor
from recovery.actions.compensations import unwind_start
from recovery.models import Unwind
from tests.factories import HR_PATH, HR_SECRET, WS_PATH, WS_SECRET, load_onboarding_policies, onboarding_saga
from tests.support import promql
from tests.support.processes import (
    RedisServer,
    Worker,
    database_url_for_subprocesses,
    dump_worker_logs,
    free_port,
    procfile_web,
    serve_webhooks,
    wait_for,
)
from tests.support.promtool import check_metrics
from tests.test_metrics import NAMED

# Whole processes (gunicorn and a worker): the slow lane.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(360), pytest.mark.django_db(transaction=True)]

TOKEN = secrets.token_urlsafe(24)
REVISION = "0123456789abcdef0123456789abcdef01234567"  # as a build sets SAGA_REVISION


@dataclass
class Web:
    base: str
    process: subprocess.Popen[bytes]
    log: Path

    def scrape_text(self) -> str:
        response = httpx.get(f"{self.base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20)
        assert response.status_code == 200, response.text
        return response.text

    def scrape(self) -> dict[str, float]:
        return promql.exposed(self.scrape_text())


@dataclass
class MetricsDir:
    path: Path
    gone: Path  # the file of a process of an earlier deployment, no longer running
    running: Path  # the file of a process that still runs here (this test's)


@pytest.fixture
def metrics_dir(tmp_path: Path) -> MetricsDir:
    """The directory the web and the worker share, with what earlier processes left in it."""
    path = tmp_path / "prometheus"
    path.mkdir()
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    stale = path / f"counter_{int(gone.stdout)}.db"
    stale.write_bytes(b"left behind by an earlier deployment")
    running = path / f"gauge_livesum_{os.getpid()}.db"
    MmapedDict(str(running)).close()
    return MetricsDir(path=path, gone=stale, running=running)


@pytest.fixture
def web(metrics_dir: MetricsDir, own_redis: RedisServer, tmp_path: Path) -> Iterator[Web]:
    """The Procfile's web line as a deployment runs it, with only a deployment's environment."""
    port = free_port()
    env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": own_redis.url,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "DB_CONN_MAX_AGE": "0",
        "LOG_LEVEL": "WARNING",
        "PORT": str(port),
        "WEB_BIND_HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "2",
        "WEB_THREADS": "2",
        "SAGA_METRICS_TOKEN": TOKEN,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir.path),
        "SAGA_REVISION": REVISION,
        # An installation sink, for the audit stream's lag (the web only reads it; the worker
        # here has no sink and sends nothing).
        "SAGA_AUDIT_SYSLOG_URL": "tcp://127.0.0.1:9",
    }
    log = tmp_path / "web.log"
    with procfile_web(env, log) as process:
        yield Web(base=f"http://127.0.0.1:{port}", process=process, log=log)


def _record_through_the_web(web: Web, secret: str, count: int) -> None:
    with httpx.Client(base_url=web.base, headers={"Authorization": f"Bearer {secret}"}, timeout=20) as client:
        run = client.post("/api/v1/runs", json={"agent": "onboarding-agent", "request": "Onboard Ada"})
        assert run.status_code == 201, run.text
        for n in range(count):
            response = client.post(
                f"/api/v1/runs/{run.json()['id']}/actions",
                json={
                    "tool": "hr.create_user",
                    "target_type": "user",
                    "target_id": f"ada{n}@company.com",
                    "args": {"email": f"ada{n}@company.com"},
                    "idempotency_key": f"metrics-{n}",
                    "compensation": {"tool": "hr.delete_user", "args": {"email": f"ada{n}@company.com"}},
                },
            )
            assert response.status_code == 201, response.text


def test_one_scrape_of_the_web_adds_up_its_processes_and_the_workers(
    web: Web,
    metrics_dir: MetricsDir,
    start_worker: Callable[..., Worker],
    tenant: Any,
    agent_key: Any,
    agent: Actor,
    alice: Any,
) -> None:
    # gunicorn's master removed what a process that is gone left, before it started its workers;
    # the file of a process still running stays.
    assert not metrics_dir.gone.exists() and metrics_dir.running.exists()
    check_metrics(web.scrape_text())
    before = web.scrape()
    assert {key.split("{", 1)[0] for key in before} >= NAMED
    build = [key for key in before if key.startswith("saga_build_info")]
    assert len(build) == 1 and f'revision="{REVISION}"' in build[0] and before[build[0]] == 1
    # From start-up, at zero until they move.
    for key in (
        'saga_ledger_writes_total{kind="record"}',
        'saga_ledger_writes_total{kind="move"}',
        'saga_unwind_steps_total{outcome="done"}',
        'saga_unwind_steps_total{outcome="failed"}',
        "saga_unwind_step_duration_seconds_count",
        'saga_recovery_items_open{reason="failed",tenant="acme"}',
        'saga_approvals_pending{tenant="acme"}',
        "saga_notifications_pending",
        'saga_rq_workers{queue="compensations"}',
    ):
        assert before[key] == 0, key

    with serve_webhooks({HR_PATH: HR_SECRET, WS_PATH: WS_SECRET}) as hooks:
        load_onboarding_policies(webhooks=hooks)
        started = time.time()
        worker = start_worker(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir.path))
        wait_for(
            lambda: web.scrape()['saga_rq_workers{queue="compensations"}'] == 1,
            timeout=60,
            what="the worker to be counted alive",
        )
        # Its ticker's passes, read by the web's scrape from Redis.
        wait_for(
            lambda: web.scrape()["saga_periodic_last_tick_timestamp_seconds"] >= started,
            timeout=60,
            what="the worker's ticker to record a pass",
        )
        _record_through_the_web(web, agent_key[1], count=3)
        saga = onboarding_saga(tenant, agent)  # recorded here, failed into the queue
        assert saga.item is not None
        assert web.scrape()['saga_recovery_items_open{reason="failed",tenant="acme"}'] == 1

        unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="hire withdrew")

        def finished() -> bool:
            unwind.refresh_from_db()
            return unwind.status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED)

        try:
            wait_for(finished, timeout=120, what="the unwind to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
        assert unwind.status == Unwind.Status.COMPLETED
        text = web.scrape_text()
        check_metrics(text)
        after = promql.exposed(text)

    def moved(key: str) -> float:
        return after[key] - before[key]

    # The web's gunicorn workers: three actions recorded, four API requests answered.
    assert moved('saga_ledger_writes_total{kind="record"}') == 3
    assert moved('saga_http_requests_total{status="2xx",surface="api"}') == 4
    assert moved('saga_http_request_duration_seconds_count{surface="api"}') == 4
    # The worker's work horses: two steps carried out, each moving its action.
    assert moved('saga_unwind_steps_total{outcome="done"}') == 2
    assert moved("saga_unwind_step_duration_seconds_count") == 2
    assert moved('saga_ledger_writes_total{kind="move"}') >= 2
    assert after['saga_recovery_items_open{reason="failed",tenant="acme"}'] == 0
    # The events those writes audited wait for the sink no worker here delivers to.
    assert moved('saga_audit_stream_undelivered_events{sink="syslog",tenant="acme"}') > 0
    assert after['saga_audit_stream_lag_seconds{sink="syslog",tenant="acme"}'] > 0
    # Webhook steps run in the worker's own process (no horse: docs/RECOVERY.md, "Which jobs
    # fork"), and a horse, where one is forked, shares one file: never a file per job.
    horse_files = sorted(path.name for path in metrics_dir.path.glob("counter_*-horse.db"))
    assert horse_files in ([], [f"counter_{worker.process.pid}-horse.db"]), horse_files

    exposed = {key.split("{", 1)[0] for key in after}
    queries = promql.rule_queries() + promql.dashboard_queries()
    missing = {q.where: sorted(q.metrics - exposed) for q in queries if not q.metrics <= exposed}
    assert not missing, missing


def test_a_worker_in_its_own_container_serves_its_own_metrics(
    tmp_path: Path, start_worker: Callable[..., Worker], tenant: Any, agent: Actor, alice: Any
) -> None:
    """A worker that shares no metrics directory with the web (a Compose service, a Kubernetes
    pod): with SAGA_WORKER_METRICS_PORT its work horses' values reach a scrape of the worker
    itself, behind the web's token; the PostgreSQL and Redis gauges stay the web's alone."""
    own_dir = tmp_path / "worker-metrics"
    own_dir.mkdir()
    port = free_port()
    with serve_webhooks({HR_PATH: HR_SECRET, WS_PATH: WS_SECRET}) as hooks:
        load_onboarding_policies(webhooks=hooks)
        worker = start_worker(
            PROMETHEUS_MULTIPROC_DIR=str(own_dir),
            SAGA_WORKER_METRICS_PORT=str(port),
            SAGA_METRICS_TOKEN=TOKEN,
        )
        url = f"http://127.0.0.1:{port}/metrics"

        def listening() -> bool:
            try:
                return httpx.get(url, timeout=5).status_code == 401
            except httpx.TransportError:
                return False

        wait_for(listening, timeout=60, what="the worker's /metrics to listen")
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        # The token, as on the web: none, another, another scheme → 401; then only GET /metrics.
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {TOKEN}"}):
            refused = httpx.get(url, headers=headers, timeout=5)
            assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert httpx.get(url.replace("/metrics", "/"), headers=bearer, timeout=5).status_code == 404
        assert httpx.post(url, headers=bearer, timeout=5).status_code == 405

        saga = onboarding_saga(tenant, agent)
        assert saga.item is not None
        unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="hire withdrew")

        def finished() -> bool:
            unwind.refresh_from_db()
            return unwind.status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED)

        try:
            wait_for(finished, timeout=120, what="the unwind to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
    scraped = httpx.get(url, headers=bearer, timeout=20)
    assert scraped.status_code == 200 and scraped.headers["Content-Type"].startswith("text/plain")
    check_metrics(scraped.text)
    exposed = promql.exposed(scraped.text)
    assert [key for key in exposed if key.startswith("saga_build_info")] != []
    assert exposed['saga_unwind_steps_total{outcome="done"}'] == 2
    assert exposed["saga_unwind_step_duration_seconds_count"] == 2
    # The gauges read from PostgreSQL and Redis are the web's: a worker's scrape never repeats them.
    assert not any(key.startswith(("saga_recovery_items_open", "saga_rq_workers")) for key in exposed)


def test_a_worker_refuses_a_metrics_port_that_is_not_a_port(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DEBUG": "1",
        "DATABASE_URL": database_url_for_subprocesses(),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "SAGA_METRICS_TOKEN": "",
    }
    for port, says in (
        ("http", "is not a TCP port"),
        ("70000", "1-65535"),
        ("-1", "is not a TCP port"),
    ):
        done = subprocess.run(
            [sys.executable, "manage.py", "saga_worker", "--no-periodic"],
            env={**env, "SAGA_WORKER_METRICS_PORT": port},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode != 0 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
