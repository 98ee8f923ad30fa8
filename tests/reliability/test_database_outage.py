"""Scenario 3d: PostgreSQL goes away. On a PostgreSQL of the test's own (never the machine's
shared one), a real gunicorn (the Procfile's web line) and a real ``saga_worker``: the database is
stopped as if it crashed, then started again. Throughout, the worker process stays alive and the
web answers: /livez 200, /readyz 503 naming the database while it is down and 200 once it is back,
and every API request and page 503 with Retry-After, never 500; afterwards the same worker carries
out a new decision."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support.processes import (
    ROOT,
    PostgresServer,
    dump_worker_logs,
    free_port,
    procfile_web,
    spawn_worker,
    wait_for,
)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def postgres():
    """A migrated database on a throwaway cluster, stopped and removed afterwards."""
    server = PostgresServer()
    server.init()
    server.start()
    try:
        server.create_database("saga")
        subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
            env={**os.environ, "DATABASE_URL": server.url("saga")},
            check=True,
            capture_output=True,
            timeout=240,
        )
        yield server
    finally:
        server.remove()


def _seed(postgres: PostgresServer, hooks_base: str, sagas: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.reliability.outage_seed", hooks_base, str(sagas)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": postgres.url("saga")},
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _unwind_status(postgres: PostgresServer, unwind_id: str) -> str | None:
    with psycopg.connect(postgres.url("saga")) as conn:
        row = conn.execute("SELECT status FROM recovery_unwind WHERE id = %s", [unwind_id]).fetchone()
    return row[0] if row else None


@pytest.mark.django_db(transaction=True)
def test_scenario_3d_postgres_down_and_back(postgres, hooks, worker_env, redis_server, tmp_path, results):
    seeded = _seed(postgres, f"http://127.0.0.1:{hooks.port}", sagas=2)
    auth = {"Authorization": f"Bearer {seeded['operator']}"}
    worker = spawn_worker(
        redis_url=redis_server.url,
        log_path=tmp_path / "worker.log",
        env={
            **worker_env,
            "DATABASE_URL": postgres.url("saga"),
            "SAGA_SWEEP_INTERVAL_S": "3",
            "SAGA_WORKER_BEAT_DIR": str(tmp_path / "beats"),
        },
    )
    port, static = free_port(), tmp_path / "static"
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    web_env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "DATABASE_URL": postgres.url("saga"),
        "REDIS_URL": redis_server.url,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "PORT": str(port),
        "WEB_BIND_HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "1",
        "WEB_THREADS": "2",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics),
        "STATIC_ROOT": str(static),
    }
    # The pages /readyz renders need the static files' manifest a deployment's collectstatic writes.
    static.mkdir()
    subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "collectstatic", "--noinput", "-v", "0"],
        env={**os.environ, **web_env},
        check=True,
        capture_output=True,
        timeout=240,
    )
    base = f"http://127.0.0.1:{port}"
    first, second = seeded["sagas"]
    try:
        with procfile_web(web_env, tmp_path / "web.log"), httpx.Client(base_url=base, timeout=20) as web:
            assert web.get("/readyz").status_code == 200, web.get("/readyz").text
            decided = web.post(
                f"/api/v1/recovery/{first['item']}/compensate", json={"reason": "undo"}, headers=auth
            )
            assert decided.status_code == 202, decided.text
            unwind = decided.json()["id"]
            wait_for(
                lambda: _unwind_status(postgres, unwind) == "completed", timeout=180, what="the first unwind"
            )

            postgres.stop()
            # The worker meets the outage (its periodic jobs fail on the database) and stays.
            wait_for(
                lambda: worker.process.poll() is not None or "OperationalError" in worker.log(),
                timeout=60,
                what="the worker to meet the outage",
            )
            assert worker.process.poll() is None, "the worker process exited during the database outage"
            assert web.get("/livez").status_code == 200
            ready = web.get("/readyz")
            assert ready.status_code == 503 and ready.json()["database"].startswith("down")
            answers = {
                "compensate": web.post(
                    f"/api/v1/recovery/{second['item']}/compensate", json={"reason": "undo"}, headers=auth
                ),
                "queue": web.get("/api/v1/recovery", headers=auth),
                "unwind": web.get(f"/api/v1/unwinds/{unwind}", headers=auth),
                "page": web.get("/", cookies=seeded["session"], follow_redirects=False),
            }
            for name, answer in answers.items():
                assert answer.status_code == 503, (name, answer.status_code, answer.text[:300])
                assert int(answer.headers["Retry-After"]) > 0, name
            for name in ("compensate", "queue", "unwind"):
                assert answers[name].json()["error"]["code"] == "database_unavailable", name

            postgres.start()
            wait_for(
                lambda: web.get("/readyz").status_code == 200, timeout=60, what="/readyz to be ready again"
            )
            decided = web.post(
                f"/api/v1/recovery/{second['item']}/compensate", json={"reason": "undo"}, headers=auth
            )
            assert decided.status_code == 202, decided.text
            again = decided.json()["id"]
            wait_for(
                lambda: _unwind_status(postgres, again) == "completed", timeout=90, what="the second unwind"
            )
            assert worker.process.poll() is None
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
    finally:
        worker.stop()
    assert dict(hooks.effects) == {action: 1 for s in (first, second) for action in s["actions"]}
    results.record(
        "3d-postgres-down-and-back",
        faults_injected=1,
        requests_during_outage=len(answers),
        server_errors=0,
        worker_exits=0,
        unwinds_completed=2,
        duplicates_observed=0,
    )
