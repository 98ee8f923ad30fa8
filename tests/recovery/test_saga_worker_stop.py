from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from redis import Redis
from rq import Queue, Worker

from tests.support.processes import spawn_worker, wait_for


@pytest.mark.django_db(transaction=True)
def test_it_stops_an_idle_worker_on_sigterm(tmp_path):
    """A deploy or Ctrl-C sends SIGTERM: an idle saga_worker must exit promptly instead of
    starting a fresh RQ worker loop (rq only flags the stop when a job is running)."""
    from django.conf import settings

    # Idle means idle: jobs that earlier tests left on the shared Redis (a slow compensator step, a
    # push to an address that no longer answers) would keep this worker busy past the deadline.
    connection = Redis.from_url(settings.REDIS_URL)
    for name in ("default", "compensations", "notifications"):
        Queue(name, connection=connection).empty()
    worker = spawn_worker(redis_url=settings.REDIS_URL, log_path=tmp_path / "worker.log")
    try:
        # Signal only once rq's own handlers are installed: the worker has registered in Redis.
        wait_for(
            lambda: (
                worker.process.poll() is not None
                or any(w.pid == worker.process.pid for w in Worker.all(connection=connection))
            ),
            timeout=60,
            what="the worker to register",
        )
        assert worker.process.poll() is None, worker.log()
        # rq registers a moment before it installs its signal handlers; give it that moment so
        # the signal exercises rq's stop path (the one that used to restart the loop).
        time.sleep(1)
        os.kill(worker.process.pid, signal.SIGTERM)
        try:
            code = worker.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("saga_worker ignored SIGTERM:\n" + worker.log()[-3000:])
        # 0 after rq's warm shutdown; -SIGTERM if the signal still beat rq's handlers. Either way
        # the worker stopped instead of starting a new work loop.
        assert code in (0, -signal.SIGTERM)
        assert "restarting" not in worker.log()
    finally:
        worker.stop()
