"""A ``saga_worker`` outlives what it depends on: Redis going away, Redis coming back empty, and
PostgreSQL going away.

Why each piece exists (rq 3's own behaviour, read from its source):

- rq's work loop leaves on any exception outside its wait for a job (a Redis error while it checks
  for suspension, cleans its registries, starts a job or beats after one) and then records its
  death in Redis, in a ``finally``. With Redis still gone that write raises too, out of
  ``Worker.work``: the process exited ("found an unhandled exception, quitting…"), and a Procfile
  runner then stopped every other process with it. Here the death is recorded when Redis answers
  again, and the worker starts over (``keep_working``): it waits, whatever the outage's length.
- While a work horse runs, rq's monitor beats to Redis every few seconds and leaves its loop on the
  first failure, leaving the horse unsupervised. Here a failed beat is logged and the monitor
  keeps waiting for its horse (the job's own state is in PostgreSQL).
- rq registers a worker once, at its birth: in the set of workers and one set per queue, which
  ``saga_rq_workers`` and the worker probe read. A Redis restarted empty forgets it, and rq's
  heartbeat only recreates the worker's hash, not its membership, so a live worker went uncounted
  until it was restarted. A keeper thread (``RegistrationKeeper``) checks every ``BEAT_S`` seconds
  and registers the worker again when Redis lost it.
- The same thread touches a small file per worker process (``beat_dir``): the container's probe
  (``python -m saga_admin.probe worker``) reads it when Redis does not answer, so a worker that is
  alive and waiting for Redis is not reported dead (and restarted) during a Redis outage.

A PostgreSQL outage needs nothing here: the worker process itself holds no database connection
(``django_rq.utils.reset_db_connections`` before each work loop), its jobs fail while PostgreSQL is
down and their steps are picked up again from PostgreSQL by the sweeper once it is back.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from redis.exceptions import RedisError
from rq import Worker, worker_registration
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.utils import now

log = structlog.get_logger(__name__)

# How often the keeper checks the worker's registration and touches its beat file. The probe
# allows a few of these (``BEAT_STALE_S``) before it calls a beat file stale.
BEAT_S = 5.0
BEAT_STALE_S = 30.0
# Waiting for Redis between work loops: 1 s, doubling, at most this (as rq's own reconnection).
MAX_WAIT_S = 5.0
# A work loop that lasted this long was a healthy one: the next wait starts again at 1 s.
HEALTHY_RUN_S = 30.0


def beat_dir() -> Path:
    """Where the worker processes of this host (container) leave their beat files:
    ``SAGA_WORKER_BEAT_DIR``, else ``saga-worker-beats`` in the temporary directory (``/tmp`` is a
    writable volume in the Kubernetes manifests, the container's own /tmp in compose)."""
    configured = os.environ.get("SAGA_WORKER_BEAT_DIR", "")
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "saga-worker-beats"


class ResilientWorker(Worker):
    """rq's worker, with a death that waits for Redis, a horse monitor that survives a failed beat
    and a registration that can be made again (the keeper calls ``ensure_registered``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Held while registering again and while recording the death, so the keeper never
        # registers a worker that is leaving.
        self.registration_lock = threading.Lock()
        self.left = False
        self.death_unrecorded = False

    def register_death(self) -> None:
        with self.registration_lock:
            self.left = True
            try:
                super().register_death()  # type: ignore[no-untyped-call]  # rq leaves it unannotated
            except RedisError as exc:
                # Recorded by keep_working once Redis answers; raising here ended the process.
                self.death_unrecorded = True
                log.warning("worker.death_unrecorded", worker=self.name, error=str(exc))
            else:
                self.death_unrecorded = False

    def maintain_heartbeats(self, job: Job, execution: Execution) -> None:
        try:
            super().maintain_heartbeats(job, execution)
        except RedisError as exc:
            # The horse works on; rq would leave its monitor loop here and let it run unwatched.
            log.warning("worker.heartbeat_failed", worker=self.name, job=job.id, error=str(exc))

    def ensure_registered(self) -> bool:
        """Register again if Redis lost this worker (restarted empty, or flushed); True if it did.
        Raises RedisError while Redis does not answer."""
        with self.registration_lock:
            if self.left or self.birth_date is None:
                return False
            queue_keys = [worker_registration.WORKERS_BY_QUEUE_KEY % name for name in self.queue_names()]
            with self.connection.pipeline() as pipeline:
                pipeline.hexists(self.key, "birth")
                pipeline.sismember(self.redis_workers_keys, self.key)
                for key in queue_keys:
                    pipeline.sismember(key, self.key)
                present = pipeline.execute()
            if all(present):
                return False
            # The process is alive and its loop is reconnecting: a beat as of now, honestly.
            self.last_heartbeat = now()
            with self.connection.pipeline() as pipeline:
                pipeline.hset(self.key, mapping={**self.serialize(), "state": self.get_state()})
                worker_registration.register(self, pipeline)
                pipeline.expire(self.key, self.worker_ttl + 60)
                pipeline.execute()
        log.warning("worker.registered_again", worker=self.name, reason="Redis had lost its registration")
        return True


class RegistrationKeeper(threading.Thread):
    """Daemon thread of a worker process: every ``BEAT_S`` it touches this process's beat file and,
    when Redis answers, registers the current worker again if Redis lost it."""

    def __init__(self, *, directory: Path | None = None) -> None:
        super().__init__(name="saga-worker-liveness", daemon=True)
        self._stop_event = threading.Event()
        self._worker: ResilientWorker | None = None
        self.beat_path = (directory or beat_dir()) / f"worker-{os.getpid()}.json"

    def watch(self, worker: ResilientWorker | None) -> None:
        self._worker = worker

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.beat_once()
            self._stop_event.wait(BEAT_S)

    def beat_once(self) -> None:
        worker = self._worker
        redis = "ok"
        if worker is not None:
            try:
                worker.ensure_registered()
            except RedisError as exc:
                redis = f"down: {type(exc).__name__}"
        self._touch(worker, redis)

    def _touch(self, worker: ResilientWorker | None, redis: str) -> None:
        body = {"pid": os.getpid(), "worker": worker.name if worker else None, "redis": redis}
        try:
            self.beat_path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.beat_path.with_suffix(".tmp")
            partial.write_text(json.dumps(body))
            partial.replace(self.beat_path)  # the probe never reads half a file
        except OSError as exc:
            # No beat file: the probe falls back to Redis alone, as before. Said once.
            if not getattr(self, "_said_no_file", False):
                self._said_no_file = True
                log.warning("worker.beat_file_unwritable", path=str(self.beat_path), error=str(exc))

    def stop(self) -> None:
        self._stop_event.set()
        with contextlib.suppress(OSError):
            self.beat_path.unlink()


class _Backoff:
    def __init__(self) -> None:
        self.seconds = 1.0

    def sleep(self) -> None:
        time.sleep(self.seconds)
        self.seconds = min(self.seconds * 2, MAX_WAIT_S)

    def reset(self) -> None:
        self.seconds = 1.0


def _stopping(worker: ResilientWorker) -> bool:
    # rq marks _stop_requested only when a signal arrives mid-job; an idle worker told to stop just
    # leaves its loop. Either way it recorded when the stop was asked for.
    return worker._stop_requested or worker._shutdown_requested_date is not None


def _leave(previous: ResilientWorker, wait: _Backoff, say: Callable[[str], Any]) -> bool:
    """Record the death a Redis outage kept rq from recording; False while Redis does not answer.
    Left out, the gauge would count the old registration beside the new one."""
    previous.register_death()
    if not previous.death_unrecorded:
        return True
    say(f"saga_worker: Redis still does not answer; retrying in {wait.seconds:.0f}s")
    wait.sleep()
    return False


def _join(
    make_worker: Callable[[], ResilientWorker], wait: _Backoff, say: Callable[[str], Any], *, burst: bool
) -> ResilientWorker | None:
    try:
        return make_worker()
    except RedisError as exc:
        if burst:
            raise
        say(f"saga_worker: cannot register with Redis ({exc}); retrying in {wait.seconds:.0f}s")
        wait.sleep()
        return None


def _run_once(
    worker: ResilientWorker,
    run: Callable[[ResilientWorker], None],
    keeper: RegistrationKeeper | None,
    say: Callable[[str], Any],
    *,
    burst: bool,
) -> float:
    """One work loop; how long it lasted."""
    if keeper is not None:
        keeper.watch(worker)
    started = time.monotonic()
    try:
        run(worker)
    except RedisError as exc:
        # rq registers its birth and starts its scheduler outside its loop's guard.
        if burst:
            raise
        say(f"saga_worker: Redis failed while the worker started ({exc})")
        worker.death_unrecorded = True
    finally:
        if keeper is not None:
            keeper.watch(None)
    return time.monotonic() - started


def keep_working(
    make_worker: Callable[[], ResilientWorker],
    run: Callable[[ResilientWorker], None],
    *,
    burst: bool,
    keeper: RegistrationKeeper | None,
    say: Callable[[str], Any],
) -> None:
    """Run work loops until the worker is told to stop (or, in burst mode, until the queues are
    empty). A loop that ends any other way, or a Redis that does not answer, is waited out and a
    fresh worker starts: a worker that quit would strand committed decisions."""
    wait = _Backoff()
    previous: ResilientWorker | None = None
    try:
        while True:
            if previous is not None and previous.death_unrecorded and not _leave(previous, wait, say):
                continue
            worker = _join(make_worker, wait, say, burst=burst)
            if worker is None:
                continue
            lasted = _run_once(worker, run, keeper, say, burst=burst)
            if burst or _stopping(worker):
                return
            if lasted > HEALTHY_RUN_S:
                wait.reset()
            # rq leaves its loop on Redis errors (Redis gone between two jobs, a timeout).
            say(f"saga_worker: the RQ work loop ended unexpectedly; starting again in {wait.seconds:.0f}s")
            wait.sleep()
            previous = worker
    except StopRequested:
        # SIGTERM while waiting between two loops (rq's handler is still installed): a stop.
        return
