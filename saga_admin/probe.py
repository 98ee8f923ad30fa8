"""``python -m saga_admin.probe [web|worker]``: the container's health check, exit 0 when healthy.

- no argument (the image's HEALTHCHECK): whatever this container runs. The entrypoint exports
  ``SAGA_PROCESS`` (web, worker, migrate or the command's name) before it execs the process, so the
  container's main process (pid 1; ``--pid``) carries it in its environment: ``web`` and ``worker``
  are checked as below; a one-shot command (``migrate``, ``create_agent_key`` ...) has nothing
  long-running to check and is healthy while it runs. One image, one HEALTHCHECK, and the worker's
  container is judged by the worker's check, not by a web port it never opens.
- ``web``: ``GET /livez`` on this container's own port (``PORT``, 8000 if unset). Liveness only: a
  database outage must not get every web container restarted.
- ``worker``: an RQ worker of this host (the container's hostname) has sent its heartbeat to Redis
  within ``--max-age`` seconds. 480 by default: an idle ``saga_worker`` beats every 30 s (it caps
  its wait for a job there; a plain RQ worker waits 405 s at RQ's default worker TTL of 420 s),
  and Redis drops a worker that has not beaten for its TTL + 60 s. A worker Redis forgot (restarted empty) registers again
  within seconds (recovery/worker_liveness.py). While Redis does not answer, a worker process of
  this container that is alive and waiting for it is healthy: each one touches its beat file
  every few seconds (``SAGA_WORKER_BEAT_DIR``), and a restart would not bring Redis back.
- ``worker --ready`` (Kubernetes' readiness probe): the same heartbeat, and no allowance for an
  outage: Redis answers and this host's worker is registered there (so it takes jobs), and
  PostgreSQL answers (every job reads and writes it). A worker waiting out an outage is alive,
  not ready: a rollout does not count it as capacity, and it is not restarted either.

Standard library and the installed server only: the image has no curl.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path


def probe_web(port: str, timeout: float) -> str | None:
    """None when ``/livez`` answers 200, else what went wrong."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=timeout) as response:  # noqa: S310 - a fixed http URL
            status = int(response.status)
    except (urllib.error.URLError, OSError) as exc:
        return f"/livez did not answer: {exc}"
    return None if status == 200 else f"/livez answered {status}"


def probe_worker(max_age: float, *, ready: bool = False) -> str | None:
    """None when a worker of this host has beaten recently, else what went wrong. ``ready``: and
    Redis and PostgreSQL answer (no allowance for a worker waiting out an outage)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
    import django

    django.setup()
    import django_rq
    from rq import Worker

    hostname = socket.gethostname()
    try:
        workers = Worker.all(connection=django_rq.get_connection("default"))
    except Exception as exc:  # noqa: BLE001 - any failure to ask Redis is the answer
        if not ready and waiting_workers():
            return None  # alive, waiting for Redis: restarting it would not help
        return f"Redis did not answer ({type(exc).__name__}: {exc}) and no worker process here beats"
    if ready:
        from django.db import connection

        try:
            connection.ensure_connection()
        except Exception as exc:  # noqa: BLE001 - any failure to reach PostgreSQL is the answer
            return f"PostgreSQL did not answer ({type(exc).__name__})"
        finally:
            connection.close()
    now = datetime.now(UTC)
    ages = [
        (now - beat.replace(tzinfo=beat.tzinfo or UTC)).total_seconds()
        for worker in workers
        if worker.hostname == hostname and (beat := worker.last_heartbeat) is not None
    ]
    if not ages:
        return f"no RQ worker of host {hostname} is registered"
    if min(ages) > max_age:
        return f"the RQ worker of host {hostname} last beat {min(ages):.0f} s ago"
    return None


def waiting_workers() -> list[int]:
    """The pids of this container's worker processes that are alive and touched their beat file
    recently (recovery.worker_liveness.RegistrationKeeper). A killed worker leaves its file: the pid
    must still run, and the file must be fresh (a hung process stops touching it)."""
    import time

    from recovery.worker_liveness import BEAT_STALE_S, beat_dir

    alive = []
    for path in beat_dir().glob("worker-*.json"):
        try:
            fresh = time.time() - path.stat().st_mtime < BEAT_STALE_S
            pid = int(json.loads(path.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone meanwhile, or not ours
        if fresh and _running(pid):
            alive.append(pid)
    return alive


def container_process(pid: int = 1) -> str:
    """What this container runs: ``SAGA_PROCESS`` in the environment of its main process (the
    entrypoint exports it before exec), else this process's own; "" when neither says."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    for entry in environ:
        name, _, value = entry.partition(b"=")
        if name == b"SAGA_PROCESS":
            return value.decode(errors="replace")
    return os.environ.get("SAGA_PROCESS", "")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process, but it exists
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc to ask: it exists
    return state != "Z"  # a zombie has exited, its parent has not reaped it yet


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m saga_admin.probe", description=__doc__.split("\n")[0])
    parser.add_argument(
        "process", nargs="?", choices=["web", "worker"], help="default: what the container runs"
    )
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds /livez may take (web)")
    parser.add_argument(
        "--max-age", type=float, default=480.0, help="seconds since the last heartbeat (worker)"
    )
    parser.add_argument(
        "--ready", action="store_true", help="worker: ready to take jobs (Redis and PostgreSQL answer)"
    )
    parser.add_argument(
        "--pid", type=int, default=1, help="the container's main process, whose SAGA_PROCESS says what runs"
    )
    args = parser.parse_args(argv)
    process = args.process or container_process(args.pid)
    if process == "web":
        problem = probe_web(os.environ.get("PORT", "8000"), args.timeout)
    elif process == "worker":
        problem = probe_worker(args.max_age, ready=args.ready)
    elif process:
        print(f"healthy: {process} is a one-shot command, with nothing long-running to check")
        return
    else:
        problem = "SAGA_PROCESS is not set: this container was not started by the image's entrypoint"
    if problem:
        sys.exit(f"unhealthy: {problem}")
    print("healthy")


if __name__ == "__main__":
    main()
