"""How the periodic jobs run: a ticker thread inside every ``saga_worker`` process.

Every SAGA SWEEP_INTERVAL_S the ticker enqueues the periodic jobs onto the ``default`` queue. A
Redis ``SET NX EX`` per job makes one tick win per interval however many worker processes run
on however many hosts, so adding workers adds capacity, not duplicate sweeps.

Why not rq's CronScheduler or self-rescheduling jobs: the CronScheduler is a separate blocking
loop that stops on the first Redis error, and a job that re-enqueues itself is lost for good
when Redis restarts empty, which is exactly when the sweeper is needed. The ticker shrugs off a
Redis outage (it logs and tries again next tick) and so do the jobs, whose state lives in
PostgreSQL.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import django_rq
import structlog
from django.conf import settings
from redis.exceptions import RedisError

from ledger.conf import saga
from recovery import queueing

log = structlog.get_logger(__name__)


# The stores pruned past their retention (ledger.pruning): hourly, each run in short batches.
PRUNE_EVERY_S = 3600.0


@dataclass(frozen=True)
class Periodic:
    func: str
    every_s: float


def periodic_jobs() -> list[Periodic]:
    interval = saga().sweep_interval_s
    return [
        Periodic("recovery.jobs.sweep", interval),
        Periodic("recovery.jobs.approvals_expire", interval),
        Periodic("recovery.jobs.notifications_sweep", interval),
        Periodic("recovery.jobs.agents_detect_lost", max(interval, 5.0)),
        Periodic("recovery.jobs.commands_redeliver", max(interval, 5.0)),
        Periodic("recovery.jobs.commands_flag_overdue", max(interval, 5.0)),
        Periodic("recovery.jobs.idempotency_prune", PRUNE_EVERY_S),
        Periodic("recovery.jobs.notifications_prune", PRUNE_EVERY_S),
        Periodic("recovery.jobs.sessions_prune", PRUNE_EVERY_S),
        Periodic("recovery.jobs.audit_stream_deliver", interval),
        Periodic("recovery.jobs.bulks_sweep", interval),
        Periodic("recovery.jobs.audit_heads_sign", float(getattr(settings, "AUDIT_SIGN_INTERVAL_S", 60.0))),
        # Retention (recovery.archive): runs past their tenant's window archived and removed.
        Periodic("recovery.jobs.runs_archive", saga().archive_interval_s),
    ]


def tick() -> list[str]:
    """Enqueue every periodic job whose interval has come round (cluster-wide); return them."""
    connection = django_rq.get_connection("default")
    enqueued = []
    for periodic in periodic_jobs():
        # The key expires a little before the next tick is due, so a tick is never skipped
        # because its own previous key was still alive.
        ttl_ms = max(100, int(periodic.every_s * 1000) - 100)
        won = connection.set(f"saga:periodic:{periodic.func}", "1", nx=True, px=ttl_ms)
        timeout = max(60, int(periodic.every_s) * 4)
        if won and queueing.enqueue(periodic.func, queue="default", job_timeout=timeout):
            enqueued.append(periodic.func)
    return enqueued


class Ticker(threading.Thread):
    """Daemon thread: it dies with the worker process, and a new worker starts a new one."""

    def __init__(self) -> None:
        super().__init__(name="saga-periodic-ticker", daemon=True)
        self._stop_event = threading.Event()

    def run(self) -> None:
        interval = max(0.2, min(p.every_s for p in periodic_jobs()))
        while not self._stop_event.is_set():
            try:
                tick()
            except RedisError as exc:
                log.warning("scheduling.tick_failed", error=str(exc))
            self._stop_event.wait(interval)

    def stop(self) -> None:
        self._stop_event.set()
