"""``python -m saga_admin.probe [web|worker]``: the container's health check, exit 0 when healthy.

- ``web`` (the default, the image's HEALTHCHECK): ``GET /livez`` on this container's own port
  (``PORT``, 8000 if unset). Liveness only: a database outage must not get every web container
  restarted.
- ``worker``: an RQ worker of this host (the container's hostname) has sent its heartbeat to Redis
  within ``--max-age`` seconds. 480 by default: an idle RQ worker beats each time its wait for a
  job times out (every 405 s at RQ's default worker TTL of 420 s), and Redis drops a worker that
  has not beaten for its TTL + 60 s. A worker Redis forgot (restarted empty) registers again
  within seconds (recovery/worker_liveness.py). While Redis does not answer, a worker process of
  this container that is alive and waiting for it is healthy: each one touches its beat file
  every few seconds (``SAGA_WORKER_BEAT_DIR``), and a restart would not bring Redis back.

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


def probe_worker(max_age: float) -> str | None:
    """None when a worker of this host has beaten recently, else what went wrong."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
    import django

    django.setup()
    import django_rq
    from rq import Worker

    hostname = socket.gethostname()
    try:
        workers = Worker.all(connection=django_rq.get_connection("default"))
    except Exception as exc:  # noqa: BLE001 - any failure to ask Redis is the answer
        if waiting_workers():
            return None  # alive, waiting for Redis: restarting it would not help
        return f"Redis did not answer ({type(exc).__name__}: {exc}) and no worker process here beats"
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
    parser.add_argument("process", nargs="?", choices=["web", "worker"], default="web")
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds /livez may take (web)")
    parser.add_argument(
        "--max-age", type=float, default=480.0, help="seconds since the last heartbeat (worker)"
    )
    args = parser.parse_args(argv)
    if args.process == "web":
        problem = probe_web(os.environ.get("PORT", "8000"), args.timeout)
    else:
        problem = probe_worker(args.max_age)
    if problem:
        sys.exit(f"unhealthy: {problem}")
    print("healthy")


if __name__ == "__main__":
    main()
