"""The product behind a real PgBouncer in transaction pooling mode (``SAGA_DB_POOLER=transaction``;
docs/DEPLOY.md, "Behind PgBouncer"), its few server connections shared by every process: the
agent API's writes through the Procfile's web line, an unwind and a bulk decision carried out by a
real ``saga_worker``, the archiver run twice in a row, and ``verify_audit`` over more events than
one page, each through the pooler. And what used to break there: the ``-c jit=off`` startup option
PgBouncer refuses, a session advisory lock left behind on a pooled server connection, a
server-side cursor gone between two fetches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from django.db import connection

from infra.held_locks import held_lock
from ledger.audit import _PAGE
from ledger.models import ArchivedRun, Event, Run
from ledger.services import runs
from recovery.archive.runner import _tenant_lock_name
from recovery.bulk.models import BulkOperation
from recovery.models import Unwind
from tests.factories import load_onboarding_policies, make_run, record
from tests.recovery.archive_support import KEY, age, allow, closed_run, folder_url, retention
from tests.recovery.bulk_support import crm_policies, failing_runs
from tests.support.pgbouncer import POOL_SIZE, PgBouncer
from tests.support.processes import ROOT, dump_worker_logs, free_port, procfile_web, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), pytest.mark.django_db(transaction=True)]

POOLED = {"SAGA_DB_POOLER": "transaction"}


def _pooled_env(pgbouncer: PgBouncer, **more: str) -> dict[str, str]:
    return {**os.environ, **POOLED, "DATABASE_URL": pgbouncer.url(), "DB_CONN_MAX_AGE": "60", **more}


def _manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _advisory_locks() -> int:
    """Advisory locks held by anyone on this test database (asked directly, past the pooler)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND d.datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def _pool_sessions(pgbouncer: PgBouncer) -> dict[int, str]:
    """Every server connection of the pool (its backend's pid) and the ``statement_timeout`` it
    carries now: POOL_SIZE clients, each in a transaction at once, hold all of them."""
    clients = [psycopg.connect(pgbouncer.url()) for _ in range(POOL_SIZE)]
    try:
        sessions: dict[int, str] = {}
        for client in clients:
            row = client.execute("SELECT pg_backend_pid(), current_setting('statement_timeout')").fetchone()
            assert row is not None
            sessions[int(row[0])] = str(row[1])
        assert len(sessions) == POOL_SIZE, sessions
        return sessions
    finally:
        for client in clients:
            client.close()


def test_pgbouncer_refuses_the_jit_option_and_behind_it_none_is_sent(pgbouncer):
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(pgbouncer.url(), options="-c jit=off").close()

    probe = (
        "from django.db import connection; connection.ensure_connection(); "
        "print(connection.settings_dict['DISABLE_SERVER_SIDE_CURSORS'])"
    )
    pooled = _manage(_pooled_env(pgbouncer), "shell", "-v", "0", "-c", probe)
    assert (pooled.returncode, pooled.stdout.strip()) == (0, "True"), pooled.stderr
    # Without SAGA_DB_POOLER the settings send the option, and every connection is refused.
    direct = {key: value for key, value in _pooled_env(pgbouncer).items() if key != "SAGA_DB_POOLER"}
    refused = _manage(direct, "shell", "-v", "0", "-c", probe)
    assert refused.returncode != 0
    assert "unsupported startup parameter: options" in refused.stderr


@pytest.fixture
def pooled_web(pgbouncer: PgBouncer, redis_server, tmp_path: Path) -> Iterator[httpx.Client]:
    """The Procfile's web line (2 processes × 4 threads), its database through the pooler."""
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    port = free_port()
    env = _pooled_env(
        pgbouncer,
        REDIS_URL=redis_server.url,
        PORT=str(port),
        WEB_BIND_HOST="127.0.0.1",
        WEB_CONCURRENCY="2",
        WEB_THREADS="4",
        PROMETHEUS_MULTIPROC_DIR=str(metrics),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    with (
        procfile_web(env, tmp_path / "web.log"),
        httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=30) as client,
    ):
        yield client


def _agent_saga(web: httpx.Client, secret: str, n: int) -> dict[str, str]:
    """What an agent does: a run, two actions recorded, started and succeeded, a third that fails,
    the run failed into the queue. Returns the recovery item's id and the actions'."""
    auth = {"Authorization": f"Bearer {secret}"}
    email = f"hire{n}@company.com"
    made = web.post("/runs", json={"agent": "onboarding-agent", "request": f"Onboard {email}"}, headers=auth)
    assert made.status_code == 201, made.text
    run_id = made.json()["id"]
    done: list[str] = []
    for tool, compensation in (("hr.create_user", "hr.delete_user"), ("workspace.provision_license", None)):
        body = {
            "tool": tool,
            "idempotency_key": f"{tool}-{n}",
            "target_type": "user",
            "target_id": email,
            "args": {"email": email},
            "start": True,
            **({"compensation": {"tool": compensation, "args": {"email": email}}} if compensation else {}),
        }
        recorded = web.post(f"/runs/{run_id}/actions", json=body, headers=auth)
        assert recorded.status_code == 201 and recorded.json()["status"] == "running", recorded.text
        succeeded = web.post(
            f"/actions/{recorded.json()['id']}/succeed", json={"result": {"ok": n}}, headers=auth
        )
        assert succeeded.status_code == 200, succeeded.text
        done.append(recorded.json()["id"])
    mail = web.post(
        f"/runs/{run_id}/actions",
        json={
            "tool": "email.send_welcome",
            "idempotency_key": f"mail-{n}",
            "args": {"to": email},
            "start": True,
        },
        headers=auth,
    ).json()
    failed = web.post(
        f"/actions/{mail['id']}/fail",
        json={"error": "rate-limited", "retryable": False, "layer": "tool"},
        headers=auth,
    )
    assert failed.status_code == 200, failed.text
    queued = web.post(
        f"/runs/{run_id}/fail", json={"error": "mail failed", "failed_action_id": mail["id"]}, headers=auth
    )
    assert queued.status_code == 200, queued.text
    return {"run": run_id, "item": queued.json()["recovery_item"]["id"], "done": ",".join(done)}


def test_agents_write_and_a_worker_unwinds_and_bulk_decides_through_the_pooler(
    pgbouncer, pooled_web, agent_key, operator_key, webhooks, start_worker, tenant, agent
):
    load_onboarding_policies(webhooks=webhooks)
    # Eight agents at once over 2 × 4 web threads and POOL_SIZE server connections.
    with ThreadPoolExecutor(8) as pool:
        sagas = list(pool.map(lambda n: _agent_saga(pooled_web, agent_key[1], n), range(8)))
    assert Run.objects.filter(pk__in=[s["run"] for s in sagas], status="failed").count() == 8

    worker = start_worker(**POOLED, DATABASE_URL=pgbouncer.url())
    operator = {"Authorization": f"Bearer {operator_key[1]}"}
    decided = pooled_web.post(
        f"/recovery/{sagas[0]['item']}/compensate", json={"reason": "the hire withdrew"}, headers=operator
    )
    assert decided.status_code == 202, decided.text
    unwind = Unwind.objects.get(pk=decided.json()["id"])
    try:
        wait_for(
            lambda: Unwind.objects.get(pk=unwind.pk).status in ("completed", "failed"),
            timeout=90,
            what="the unwind through the pooler",
        )
        assert Unwind.objects.get(pk=unwind.pk).status == "completed"
        assert sorted(call.path for call in webhooks.calls)  # the compensators were called

        crm_policies()
        items = failing_runs(tenant, agent, 30)
        bulk_body = {"filter": {"tool": "crm.update_*"}, "action": "close", "reason": "the CRM API was down"}
        preview = pooled_web.post("/recovery/bulk", json={**bulk_body, "preview": True}, headers=operator)
        assert preview.status_code == 200 and preview.json()["count"] == 30, preview.text
        started = pooled_web.post(
            "/recovery/bulk", json={**bulk_body, "expected_count": 30}, headers=operator
        )
        assert started.status_code == 202, started.text
        bulk_id = started.json()["id"]
        wait_for(
            lambda: BulkOperation.objects.get(pk=bulk_id).status == "finished",
            timeout=120,
            what="the bulk decision through the pooler",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}\n{pgbouncer.log()[-2000:]}") from exc
    done = BulkOperation.objects.get(pk=bulk_id)
    assert (done.done, done.failed, done.skipped) == (30, 0, 0)
    assert len(items) == 30
    # The worker's ticker set its statement timeout per transaction, never on a pooled session;
    # and nobody left a lock behind.
    assert "InvalidCursorName" not in worker.log() and "does not exist" not in worker.log()
    assert worker.process.poll() is None, worker.log()
    assert _advisory_locks() == 0
    # The worker's ticker bounds its statements per transaction: no pooled server connection
    # carries its statement_timeout to whoever gets it next.
    assert set(_pool_sessions(pgbouncer).values()) == {"0"}


def test_two_archivers_in_a_row_both_archive_through_the_pooler(pgbouncer, tenant, agent, settings, tmp_path):
    base = tmp_path / "archive"
    base.mkdir()
    allow(settings, folder_url(base))
    retention(tenant, folder_url(base))
    made = [closed_run(tenant, agent, email=f"a{n}@company.com").pk for n in range(4)]
    for run_id in made:
        age(Run.objects.get(pk=run_id))
    env = _pooled_env(
        pgbouncer, SAGA_AUDIT_KEY=KEY, SAGA_ARCHIVE_ALLOWED_URLS=folder_url(base), SAGA_ARCHIVE_GZIP="1"
    )
    for archived in (2, 4):
        out = _manage(env, "archive_runs", "--limit", "2")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "another archiver" not in out.stdout + out.stderr
        assert ArchivedRun.objects.filter(run_id__in=made).count() == archived, out.stdout + out.stderr
        # The lock went with its transaction: no pooled server connection keeps it.
        assert _advisory_locks() == 0

    # One archiver at a time all the same: while another holds the tenant, the pass leaves it.
    closed = closed_run(tenant, agent, email="late@company.com")
    age(closed)
    with held_lock(_tenant_lock_name(tenant)) as lock:
        assert lock is not None
        busy = _manage(env, "archive_runs")
    assert "another archiver is at it" in busy.stdout + busy.stderr
    assert not ArchivedRun.objects.filter(run_id=closed.pk).exists()
    again = _manage(env, "archive_runs")
    assert again.returncode == 0, again.stdout + again.stderr
    assert ArchivedRun.objects.filter(run_id=closed.pk).exists()
    verified = _manage(env, "verify_audit")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_lock_holder_killed_behind_the_pooler_releases_its_lock(pgbouncer, tenant):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import django, sys, time; django.setup()\n"
            "from infra.held_locks import held_lock\n"
            "with held_lock(sys.argv[1]) as lock:\n"
            "    print('held' if lock else 'busy', flush=True); time.sleep(600)\n",
            _tenant_lock_name(tenant),
        ],
        cwd=ROOT,
        env={**_pooled_env(pgbouncer), "DJANGO_SETTINGS_MODULE": "saga_admin.settings"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with held_lock(_tenant_lock_name(tenant)) as lock:
            assert lock is None
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        # PgBouncer closes the server connection its client left mid-transaction: the lock goes.
        wait_for(lambda: _advisory_locks() == 0, timeout=30, what="the killed holder's lock to go")
        with held_lock(_tenant_lock_name(tenant)) as lock:
            assert lock is not None
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


def test_verify_audit_walks_pages_of_events_through_the_pooler(pgbouncer, tenant, agent):
    import pgtrigger

    for n in range(60):
        run = make_run(tenant, agent)
        for k in range(40):
            record(run, agent, f"v-{n}-{k}")
        runs.run_complete(run=run, actor=agent, summary="done")
    total = Event.objects.count()
    assert total > _PAGE  # past audit_verify's first page
    env = _pooled_env(pgbouncer)
    intact = _manage(env, "verify_audit")
    assert intact.returncode == 0, intact.stderr
    assert f"{total} events checked." in intact.stdout

    # A tampered event far past the first page is found and named.
    victim = Event.objects.filter(kind="action.recorded").order_by("chain", "id")[10]
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(pk=victim.pk).update(reason="rewritten")
    broken = _manage(env, "verify_audit")
    assert broken.returncode == 1
    assert (
        f"chain {victim.chain}, event {victim.pk}: the event's content does not match its hash"
        in broken.stderr
    )
