"""The server installs itself, as the container image installs it: what is committed, exported
(``git archive HEAD``), is installed by ``deploy/docker/install.sh`` (the Dockerfile's build step:
``pip install``, not editable, without the client, into a fresh venv, and the static files collected
from the installed packages) into a folder of its own, and runs from there through the image's
entrypoint, as a container runs it: ``check --deploy`` passes, ``migrate`` migrates and bootstraps
(once: the second run changes nothing), ``web`` serves ``/livez``, ``/readyz`` and the login page
(its template and static files from the install), ``worker`` stays up and registers with RQ, and
the image's health checks (``python -m saga_admin.probe web|worker``) pass.

Commit before running it: it tests HEAD, not the working tree."""

from __future__ import annotations

import io
import json
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
from packaging.utils import canonicalize_name
from rq import Worker

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
    """The committed server installed by deploy/docker/install.sh into a fresh folder (the image's
    /opt/saga): its venv, collected static files, Procfile and entrypoint. Returns the folder."""
    export = tmp_path / "export"
    export.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(export, filter="data")
    prefix = tmp_path / "opt-saga"
    # As `make install` reaches packages: pip's own configuration, nothing added here.
    env = {
        **_base_env("/usr/local/bin:/usr/bin:/bin"),
        "PYTHON": shutil.which("python3.11") or sys.executable,
    }
    _run(
        ["sh", str(export / "deploy" / "docker" / "install.sh"), str(export), str(prefix)],
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert (prefix / "static" / "staticfiles.json").exists()
    _assert_locked_versions(prefix / "venv" / "bin" / "python")
    return prefix


def _assert_locked_versions(python: Path) -> None:
    """The install took constraints.txt's version of every runtime dependency (``make lock``)."""
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {canonicalize_name(p["name"]): p["version"] for p in json.loads(listed.stdout)}
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version.strip()
    differing = {
        name: (version, installed.get(name))
        for name, version in pins.items()
        if installed.get(name) != version
    }
    assert not differing, f"installed versions differ from constraints.txt (locked, installed): {differing}"


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
        # Behind the TLS-terminating proxy the settings expect (SECURE_PROXY_SSL_HEADER), by the
        # public name ALLOWED_HOSTS lists.
        headers = {"X-Forwarded-Proto": "https", "Host": "saga.example.com"}
        return httpx.get(url, headers=headers, timeout=5, follow_redirects=False)
    except httpx.TransportError:
        return None


def _logs(folder: Path) -> str:
    return "\n".join(
        f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}" for p in folder.glob("*.log")
    )


def _production_env(tmp_path: Path, prefix: Path, database_url: str, redis_url: str) -> dict[str, str]:
    """What the image's ENV and a deployment's configuration give a container."""
    (tmp_path / "admin-password").write_text("installed-admin-password-7731\n")
    return {
        **_base_env("/usr/local/bin:/usr/bin:/bin"),
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
        "STATIC_ROOT": str(prefix / "static"),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "ALLOWED_HOSTS": "saga.example.com",
        "PORT": str(free_port()),
        "WEB_CONCURRENCY": "1",
        "SAGA_BOOTSTRAP_TENANT": "acme",
        "SAGA_BOOTSTRAP_ADMIN_USERNAME": "ops",
        "SAGA_BOOTSTRAP_ADMIN_EMAIL": "ops@example.com",
        "SAGA_BOOTSTRAP_ADMIN_PASSWORD_FILE": str(tmp_path / "admin-password"),
    }


def _prepare(prefix: Path, env: dict[str, str], run_dir: Path) -> None:
    """What a deployment runs before it starts, through the entrypoint: the installed package (not
    the export) and no client, then check --deploy, then migrate (with the bootstrap) twice."""
    entrypoint = str(prefix / "entrypoint.sh")
    python = str(prefix / "venv" / "bin" / "python")
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
    package = next(prefix.glob("venv/lib/python*/site-packages/saga_admin/__init__.py"))
    assert located.splitlines() == [str(package), "None"]
    checked = _run([entrypoint, "check", "--deploy", "--fail-level", "WARNING"], env=env, cwd=run_dir)
    assert "no issues" in checked
    first = _run([entrypoint, "migrate"], env=env, cwd=run_dir, timeout=300)
    assert "Applying ledger.0001" in first and "Created tenant acme" in first, first
    assert first.rstrip().endswith("Bootstrap done."), first
    again = _run([entrypoint, "migrate"], env=env, cwd=run_dir, timeout=300)
    assert "No migrations to apply." in again and again.rstrip().endswith("Nothing changed."), again


def _check_web(base: str, web: subprocess.Popen[bytes], folder: Path) -> None:
    live = wait_for(lambda: _get(f"{base}/livez") or web.poll() is not None, timeout=60, what="/livez")
    assert web.poll() is None, _logs(folder)
    assert live.status_code == 200, (live.text, _logs(folder))
    # The probes answer as a kubelet asks: by the pod's address (not in ALLOWED_HOSTS), plain HTTP.
    ready = httpx.get(f"{base}/readyz", timeout=10)
    assert (ready.status_code, ready.json()) == (200, {"database": "ok", "redis": "ok", "pages": "ok"})
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


def _probe(
    prefix: Path, process: str, env: dict[str, str], run_dir: Path
) -> subprocess.CompletedProcess[str]:
    """The image's health check (Dockerfile HEALTHCHECK, compose.yaml, the worker's liveness probe)."""
    python = str(prefix / "venv" / "bin" / "python")
    return subprocess.run(
        [python, "-m", "saga_admin.probe", process],
        env=env,
        cwd=run_dir,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_an_installed_server_serves_and_works(
    tmp_path: Path, installed: Path, fresh_database: str, own_redis: RedisServer
) -> None:
    run_dir = tmp_path / "run"  # outside the export: nothing of the repository on sys.path
    run_dir.mkdir()
    env = _production_env(tmp_path, installed, fresh_database, own_redis.url)
    _prepare(installed, env, run_dir)
    entrypoint = str(installed / "entrypoint.sh")
    unhealthy = _probe(installed, "web", env, run_dir)
    assert unhealthy.returncode != 0 and "/livez did not answer" in unhealthy.stderr, unhealthy
    web = _start(f"{entrypoint} web", env=env, cwd=run_dir, log=tmp_path / "web.log")
    worker = _start(f"{entrypoint} worker", env=env, cwd=run_dir, log=tmp_path / "worker.log")
    try:
        _check_web(f"http://127.0.0.1:{env['PORT']}", web, tmp_path)
        _check_worker(own_redis.url, worker, tmp_path)
        for process in ("web", "worker"):
            healthy = _probe(installed, process, env, run_dir)
            assert (healthy.returncode, healthy.stdout.strip()) == (0, "healthy"), (healthy, _logs(tmp_path))
    finally:
        _stop(web)
        _stop(worker)
    gone = _probe(installed, "worker", env, run_dir)
    assert gone.returncode != 0 and "no RQ worker of host" in gone.stderr, gone
