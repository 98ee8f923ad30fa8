"""The server installs itself: what is committed, exported (``git archive HEAD``) and installed with
``pip install`` (not editable, without the client) into a fresh venv, runs from a directory of its
own as a deployment runs it: ``check --deploy``, ``migrate`` and ``collectstatic`` pass, the
Procfile's web line serves ``/healthz`` and the login page (its template and static files come from
the installed packages), and the Procfile's worker line stays up and registers with RQ.

Commit before running it: it tests HEAD, not the working tree."""

from __future__ import annotations

import io
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from rq import Worker

from bench.procs import procfile_lines
from tests.support.processes import (
    RedisServer,
    database_url_for_subprocesses,
    descendants,
    free_port,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[1]
# What reaches a process besides the deployment's own variables: pip's configuration (the index,
# the wheel folders and the certificates it is told to use here) and a locale.
PASSED_THROUGH = ("HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


def _base_env(path: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH or k.startswith("PIP_")}
    return {**kept, "PATH": path}


def _run(args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """A database of its own, empty, on the suite's PostgreSQL; dropped afterwards."""
    name = f"saga_install_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url_for_subprocesses("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url_for_subprocesses(name)
    finally:
        with psycopg.connect(database_url_for_subprocesses("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """A fresh venv with the committed server installed in it, non-editable; its bin folder."""
    export = tmp_path / "export"
    export.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(export, filter="data")
    python = shutil.which("python3.11") or sys.executable
    venv = tmp_path / "venv"
    _run([python, "-m", "venv", str(venv)], env=_base_env(os.environ["PATH"]), cwd=tmp_path)
    bin_dir = venv / "bin"
    # As `make install` reaches packages: pip's own configuration, nothing added here.
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", str(export)],
        env=_base_env(f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"),
        cwd=tmp_path,
        timeout=600,
    )
    return bin_dir


def _start(command: str, *, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        env=env,
        cwd=cwd,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        victims = descendants(process.pid)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        for pid in [process.pid, *victims]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    process.wait(timeout=10)


def _get(url: str) -> httpx.Response | None:
    try:
        # Behind the TLS-terminating proxy the settings expect (SECURE_PROXY_SSL_HEADER).
        return httpx.get(url, headers={"X-Forwarded-Proto": "https"}, timeout=5, follow_redirects=False)
    except httpx.TransportError:
        return None


def _logs(folder: Path) -> str:
    return "\n".join(
        f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}" for p in folder.glob("*.log")
    )


def _production_env(tmp_path: Path, bin_dir: Path, database_url: str, redis_url: str) -> dict[str, str]:
    return {
        **_base_env(f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"),
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "STATIC_ROOT": str(tmp_path / "static"),
        "PORT": str(free_port()),
        "WEB_CONCURRENCY": "1",
    }


def _prepare(bin_dir: Path, env: dict[str, str], run_dir: Path) -> None:
    """What a deployment runs before it starts: the installed package (not the export) and no
    client, then check --deploy, migrate and collectstatic, each passing."""
    python = str(bin_dir / "python")
    located = _run(
        [
            python,
            "-c",
            "import importlib.util, saga_admin\nprint(saga_admin.__file__)\n"
            "print(importlib.util.find_spec('saga_client'))",
        ],
        env=env,
        cwd=run_dir,
    )
    package = next(bin_dir.parent.glob("lib/python*/site-packages/saga_admin/__init__.py"))
    assert located.splitlines() == [str(package), "None"]
    checked = _run(
        [python, "-m", "django", "check", "--deploy", "--fail-level", "WARNING"], env=env, cwd=run_dir
    )
    assert "no issues" in checked
    _run([python, "-m", "saga_admin", "migrate", "--noinput"], env=env, cwd=run_dir, timeout=300)
    _run([python, "-m", "django", "collectstatic", "--noinput"], env=env, cwd=run_dir)
    assert (Path(env["STATIC_ROOT"]) / "staticfiles.json").exists()


def _check_web(base: str, web: subprocess.Popen[bytes], folder: Path) -> None:
    health = wait_for(lambda: _get(f"{base}/healthz") or web.poll() is not None, timeout=60, what="/healthz")
    assert web.poll() is None, _logs(folder)
    assert health.status_code == 200, (health.text, _logs(folder))
    login = _get(f"{base}/login/")
    assert login is not None and login.status_code == 200, (login and login.text[:2000], _logs(folder))
    assert login.headers["content-type"].startswith("text/html")
    assert 'name="password"' in login.text and "csrfmiddlewaretoken" in login.text
    # Its stylesheet, collected from the installed dashboard package and served hashed.
    stylesheet = re.search(r'href="(/static/[^"]+\.css)"', login.text)
    assert stylesheet, login.text
    css = _get(f"{base}{stylesheet.group(1)}")
    assert css is not None and css.status_code == 200, (css, _logs(folder))
    assert css.headers["content-type"].startswith("text/css")


def _check_worker(redis_url: str, worker: subprocess.Popen[bytes], folder: Path) -> None:
    connection = redis.Redis.from_url(redis_url)
    wait_for(
        lambda: Worker.all(connection=connection) or worker.poll() is not None,
        timeout=60,
        what="the worker to register",
    )
    time.sleep(3)  # and stays up
    assert worker.poll() is None, _logs(folder)
    registered = Worker.all(connection=connection)
    assert len(registered) == 1, _logs(folder)
    assert {q.name for q in registered[0].queues} == {"default", "compensations", "notifications"}


def test_an_installed_server_serves_and_works(
    tmp_path: Path, installed: Path, fresh_database: str, own_redis: RedisServer
) -> None:
    run_dir = tmp_path / "run"  # outside the export: nothing of the repository on sys.path
    run_dir.mkdir()
    env = _production_env(tmp_path, installed, fresh_database, own_redis.url)
    _prepare(installed, env, run_dir)
    lines = procfile_lines()
    web = _start(lines["web"], env=env, cwd=run_dir, log=tmp_path / "web.log")
    worker = _start(lines["worker"], env=env, cwd=run_dir, log=tmp_path / "worker.log")
    try:
        _check_web(f"http://127.0.0.1:{env['PORT']}", web, tmp_path)
        _check_worker(own_redis.url, worker, tmp_path)
    finally:
        _stop(web)
        _stop(worker)
