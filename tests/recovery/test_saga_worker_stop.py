from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.support.processes import spawn_worker, wait_for


@pytest.mark.django_db(transaction=True)
def test_it_stops_an_idle_worker_on_sigterm(tmp_path):
    """A deploy or Ctrl-C sends SIGTERM: an idle saga_worker must exit promptly instead of
    starting a fresh RQ worker loop (rq only flags the stop when a job is running)."""
    from django.conf import settings

    worker = spawn_worker(redis_url=settings.REDIS_URL, log_path=tmp_path / "worker.log")
    try:
        wait_for(
            lambda: (
                "Listening on" in worker.log()
                or "listening on" in worker.log().lower()
                or worker.process.poll() is not None
            ),
            timeout=30,
            what="the worker to start listening",
        )
        assert worker.process.poll() is None, worker.log()
        os.kill(worker.process.pid, signal.SIGTERM)
        try:
            code = worker.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("saga_worker ignored SIGTERM:\n" + worker.log()[-3000:])
        assert code == 0
        assert "restarting" not in worker.log()
    finally:
        worker.stop()
