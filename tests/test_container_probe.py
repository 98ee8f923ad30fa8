"""The image's one HEALTHCHECK (``python -m saga_admin.probe``, no argument) checks what its container
runs: the entrypoint exports ``SAGA_PROCESS`` before it execs the process, and the probe reads it
from the main process's environment. Before, every container of the image, the worker's and the
migrate one's too, was judged by ``GET /livez`` on a web port only the web opens.

And the worker's readiness (``probe worker --ready``, the Kubernetes readinessProbe) is honest: a
worker waiting out a Redis outage is alive (no restart) but not ready (no capacity counted)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import httpx
import pytest
import redis
from rq import Worker as RqWorker

from saga_admin import probe
from tests.support.processes import (
    ROOT,
    RedisServer,
    database_url_for_subprocesses,
    descendants,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _image_prefix(tmp_path: Path) -> Path:
    """What deploy/docker/install.sh lays out under /opt/saga, with this checkout's venv: the
    entrypoint and the Procfile beside it, as the image runs them."""
    prefix = tmp_path / "opt-saga"
    prefix.mkdir()
    shutil.copy(ROOT / "deploy" / "docker" / "entrypoint.sh", prefix / "entrypoint.sh")
    shutil.copy(ROOT / "Procfile", prefix / "Procfile")
    (prefix / "venv").symlink_to(Path(sys.executable).parent.parent)
    return prefix


def _env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)),
        "DJANGO_SETTINGS_MODULE": "saga_admin.settings",
        "DATABASE_URL": database_url_for_subprocesses(),
        "REDIS_URL": redis_url,
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "SECURE_SSL_REDIRECT": "0",
        "LOG_LEVEL": "WARNING",
        "PORT": str(free_port()),  # nothing listens there unless the web does
        "WEB_BIND_HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "1",
        "SAGA_WORKER_BEAT_DIR": str(tmp_path / "beats"),
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }


def _healthcheck(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """What the container engine runs: a new process, beside the main one (not its child)."""
    return subprocess.run(
        [sys.executable, "-m", "saga_admin.probe", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    for pid in [*descendants(process.pid), process.pid]:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=10)


def test_the_image_healthcheck_checks_what_its_container_runs(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Pass: the entrypoint's worker is healthy by the worker's check while nothing listens on its
    PORT (the web's check says /livez did not answer for the same container); the entrypoint's web
    is healthy by /livez; a one-shot command is healthy while it runs; a process not started by the
    entrypoint is not called healthy."""
    prefix = _image_prefix(tmp_path)
    env = _env(tmp_path, redis_server.url)
    started: list[subprocess.Popen[bytes]] = []

    def start(*command: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"{command[0]}.log").open("wb")
        process = subprocess.Popen(
            [str(prefix / "entrypoint.sh"), *command],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        return process

    try:
        worker = start("worker")
        connection = redis.Redis.from_url(redis_server.url)
        wait_for(
            lambda: (
                worker.poll() is not None
                or any(w.pid == worker.pid for w in RqWorker.all(connection=connection))
            ),
            timeout=60,
            what="the entrypoint's worker to register",
        )
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        checked = _healthcheck(env, "--pid", str(worker.pid))
        assert (checked.returncode, checked.stdout.strip()) == (0, "healthy"), checked
        as_a_web = _healthcheck(env, "web")  # what the image checked in every container before
        assert as_a_web.returncode != 0 and "/livez did not answer" in as_a_web.stderr, as_a_web

        web = start("web")
        wait_for(
            lambda: web.poll() is not None or _answers(f"http://127.0.0.1:{env['PORT']}/livez"),
            timeout=90,
            what="the entrypoint's web to answer /livez",
        )
        checked = _healthcheck(env, "--pid", str(web.pid))
        assert (checked.returncode, checked.stdout.strip()) == (0, "healthy"), checked

        one_shot = start("shell", "-c", "import time; time.sleep(120)")
        wait_for(
            lambda: b"SAGA_PROCESS=shell" in _environ(one_shot.pid), timeout=30, what="the command to exec"
        )
        checked = _healthcheck(env, "--pid", str(one_shot.pid))
        assert checked.returncode == 0 and "shell is a one-shot command" in checked.stdout, checked

        stranger = _healthcheck(env, "--pid", str(os.getpid()))  # this test: no SAGA_PROCESS
        assert stranger.returncode != 0 and "SAGA_PROCESS is not set" in stranger.stderr, stranger
    finally:
        for process in started:
            _stop(process)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def test_a_worker_waiting_out_a_redis_outage_is_alive_but_not_ready(
    redis_server: RedisServer, start_worker, workers, tmp_path: Path, monkeypatch
) -> None:
    """Pass: a registered worker is live and ready; with Redis stopped it stays live (its beat file
    is fresh: no restart) and is not ready, naming Redis; once Redis is back (empty) it is ready
    again, having registered itself again."""
    beats = tmp_path / "beats"
    monkeypatch.setenv("SAGA_WORKER_BEAT_DIR", str(beats))
    worker = start_worker(SAGA_WORKER_BEAT_DIR=str(beats))
    wait_for(lambda: probe.probe_worker(480, ready=True) is None, timeout=60, what="the worker to be ready")
    assert probe.probe_worker(480) is None
    wait_for(lambda: bool(probe.waiting_workers()), timeout=30, what="the worker's beat file")
    redis_server.stop()
    try:
        assert probe.probe_worker(480) is None, "alive and waiting: not to be restarted"
        not_ready = probe.probe_worker(480, ready=True)
        assert not_ready and "Redis did not answer" in not_ready
    finally:
        redis_server.start()  # empty
    wait_for(
        lambda: probe.probe_worker(480, ready=True) is None,
        timeout=60,
        what="the worker to register again and be ready",
    )
    assert worker.process.poll() is None
