"""How the periodic duties run: one cheap pass, in a ticker thread inside every ``saga_worker``.

Every SAGA SWEEP_INTERVAL_S the ticker walks the periodic duties (sweeper, approval expiry,
notification sweep, lost agents, command redelivery, overdue commands, bulk sweep, audit
stream, head signing, pruning, retention). For each whose interval has come round:

1. a Redis ``SET NX PX`` per duty makes one process win it per interval, however many worker
   processes run on however many hosts (adding workers adds capacity, not duplicate sweeps);
2. the winner asks one cheap indexed question, "is anything due?" (``Periodic.due``). Nothing
   due, the duty costs that one query: no job, no fork;
3. something due: the housekeeping duties (database and Redis only, each in bounded batches) run
   right here in the ticker thread; the ones that talk to the outside or write files (audit
   stream to a SIEM, archives to S3, pruning, head signing) are enqueued on ``default``, which
   the worker serves after ``compensations`` and ``notifications``, with their hard job timeout.

So the job queues carry decisions (unwind steps on ``compensations``, notifications and command
pushes on ``notifications``), never a backlog of housekeeping ahead of them (docs/RECOVERY.md,
"Decisions before housekeeping").

Why not rq's CronScheduler or self-rescheduling jobs: the CronScheduler is a separate blocking
loop that stops on the first Redis error, and a job that re-enqueues itself is lost for good
when Redis restarts empty, which is exactly when the sweeper is needed. The ticker shrugs off a
Redis or database error (it logs and tries again next tick) and so do the duties, whose state
lives in PostgreSQL.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import django_rq
import structlog
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import close_old_connections, connection
from django.db.models import Q, QuerySet
from django.utils import timezone
from redis.exceptions import RedisError

from infra.conf import saga
from infra.statement_bounds import StatementBound
from ledger import audit_signing, pruning
from ledger.models import Run
from ledger.services import idempotency
from recovery import approval_deadlines, queueing
from recovery import metrics as recovery_metrics
from recovery.archive import policy as archive_policy
from recovery.audit_stream import config as audit_stream
from recovery.bulk.models import BulkOperation
from recovery.models import AgentCommand, Approval, Notification, Unwind, UnwindStep
from recovery.notifications import prune as notifications_prune
from recovery.unwinds.state import IN_FLIGHT

log = structlog.get_logger(__name__)


# The stores pruned past their retention (ledger.pruning): hourly, each run in short batches.
PRUNE_EVERY_S = 3600.0

# A duty run in the ticker thread may not hold the ticker longer than this per statement: a
# stuck query must not stop every other duty of this process (another worker's ticker takes
# the duties whose keys expire meanwhile).
STATEMENT_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Periodic:
    """One periodic duty. ``func``: its job (``recovery.jobs``), by dotted path. ``due``: the cheap
    question asked first (None: always due). ``inline``: run in the ticker thread; otherwise
    enqueued on ``default`` (with ``job_timeout``) when due."""

    func: str
    every_s: float
    due: Callable[[datetime], bool] | None = None
    inline: bool = True


def _any(*querysets: QuerySet[Any]) -> bool:
    """Whether any of the querysets has a row: one statement, ``EXISTS (…) OR EXISTS (…)``, each
    read from its index (a duty's "anything due?" is one round trip however many parts it has)."""
    parts: list[str] = []
    params: list[Any] = []
    for queryset in querysets:
        sql, more = queryset.values("pk")[:1].query.sql_with_params()
        parts.append(f"EXISTS ({sql})")
        params.extend(more)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + " OR ".join(parts), params)
        row = cursor.fetchone()
    return bool(row and row[0])


def _sweep_due(now: datetime) -> bool:
    interval = saga().sweep_interval_s
    return _any(
        UnwindStep.objects.filter(status=UnwindStep.Status.RUNNING, lease_expires_at__lt=now),
        UnwindStep.objects.filter(status=UnwindStep.Status.QUEUED, unwind__status=Unwind.Status.RUNNING),
        Unwind.objects.filter(
            status=Unwind.Status.RUNNING, updated_at__lt=now - timedelta(seconds=interval)
        ).exclude(steps__status__in=IN_FLIGHT),
    )


def _approvals_due(now: datetime) -> bool:
    return _any(Approval.objects.filter(status=Approval.Status.PENDING, expires_at__lte=now))


def _notifications_due(now: datetime) -> bool:
    # Rows due and not yet sent (their job may be lost), a sending row whose lease ran out, or an
    # approval to remind: each through a partial index (recovery/migrations/0016).
    return _any(
        Notification.objects.filter(status=Notification.Status.PENDING, next_attempt_at__lte=now),
        Notification.objects.filter(status=Notification.Status.SENDING, lease_expires_at__lt=now),
        approval_deadlines.reminders_due(now=now),
    )


def _running_runs_quiet(now: datetime) -> bool:
    cutoff = now - timedelta(seconds=saga().heartbeat_timeout_s)
    return _any(
        Run.objects.filter(
            Q(last_heartbeat_at__lt=cutoff) | Q(last_heartbeat_at__isnull=True, created_at__lt=cutoff),
            status=Run.Status.RUNNING,
        )
    )


def _commands_pending(now: datetime) -> bool:
    return _any(AgentCommand.objects.filter(status=AgentCommand.Status.PENDING))


def _bulks_running(now: datetime) -> bool:
    return _any(BulkOperation.objects.filter(status=BulkOperation.Status.RUNNING))


def _audit_sinks(now: datetime) -> bool:
    return bool(audit_stream.all_sinks())


def _signing_key(now: datetime) -> bool:
    return audit_signing.signing_key() is not None


def _prunable(store: pruning.Store, cutoff: Callable[[datetime], datetime]) -> Callable[[datetime], bool]:
    def due(now: datetime) -> bool:
        # The prune's own first read (its candidates, from its index), one row.
        with connection.cursor() as cursor:
            cursor.execute(pruning.candidates_sql(store, after=False), [cutoff(now), 1])
            return cursor.fetchone() is not None

    return due


def _sessions_expired(now: datetime) -> bool:
    # The session engine in use keeps its rows in the database (the settings' default); its
    # expire_date is indexed. Another engine expires sessions itself: nothing to prune.
    if settings.SESSION_ENGINE not in {
        "django.contrib.sessions.backends.db",
        "django.contrib.sessions.backends.cached_db",
    }:
        return False
    return Session.objects.filter(expire_date__lt=now).exists()


def _retention_set(now: datetime) -> bool:
    return bool(archive_policy.tenant_retentions())


def periodic_jobs() -> list[Periodic]:
    interval = saga().sweep_interval_s
    return [
        Periodic("recovery.jobs.sweep", interval, _sweep_due),
        Periodic("recovery.jobs.approvals_expire", interval, _approvals_due),
        Periodic("recovery.jobs.notifications_sweep", interval, _notifications_due),
        Periodic("recovery.jobs.agents_detect_lost", max(interval, 5.0), _running_runs_quiet),
        Periodic("recovery.jobs.commands_redeliver", max(interval, 5.0), _commands_pending),
        Periodic("recovery.jobs.commands_flag_overdue", max(interval, 5.0), _commands_pending),
        Periodic("recovery.jobs.bulks_sweep", interval, _bulks_running),
        # Outbound or file work, with a hard timeout: a job on ``default`` when due.
        Periodic(
            "recovery.jobs.idempotency_prune",
            PRUNE_EVERY_S,
            _prunable(idempotency.STORE, idempotency.idempotency_cutoff),
            inline=False,
        ),
        Periodic(
            "recovery.jobs.notifications_prune",
            PRUNE_EVERY_S,
            _prunable(notifications_prune.STORE, notifications_prune.notifications_cutoff),
            inline=False,
        ),
        Periodic("recovery.jobs.sessions_prune", PRUNE_EVERY_S, _sessions_expired, inline=False),
        Periodic("recovery.jobs.audit_stream_deliver", interval, _audit_sinks, inline=False),
        Periodic(
            "recovery.jobs.audit_heads_sign",
            float(getattr(settings, "AUDIT_SIGN_INTERVAL_S", 60.0)),
            _signing_key,
            inline=False,
        ),
        # Retention (recovery.archive): runs past their tenant's window archived and removed.
        Periodic("recovery.jobs.runs_archive", saga().archive_interval_s, _retention_set, inline=False),
    ]


@dataclass
class TickReport:
    """What one pass did: the duties that found work and ran here, those enqueued, and the ones
    whose question found nothing (one query each)."""

    ran: list[str]
    enqueued: list[str]
    idle: list[str]
    failed: list[str]


# Runs an inline duty by its job's name: ``recovery.jobs.periodic_run``, given by the worker
# command (the jobs stand above everything this module may import).
Runner = Callable[[str], object]


def tick(run: Runner, *, now: datetime | None = None) -> list[str]:
    """One pass over the periodic duties whose interval has come round (cluster-wide); return the
    duties that did something (ran here or were enqueued)."""
    report = tick_report(run, now=now)
    return report.ran + report.enqueued


def tick_report(run: Runner, *, now: datetime | None = None) -> TickReport:
    redis = django_rq.get_connection("default")
    report = TickReport([], [], [], [])
    for periodic in periodic_jobs():
        # The key expires a little before the next tick is due, so a tick is never skipped
        # because its own previous key was still alive.
        ttl_ms = max(100, int(periodic.every_s * 1000) - 100)
        if not redis.set(f"saga:periodic:{periodic.func}", "1", nx=True, px=ttl_ms):
            continue
        try:
            if periodic.due is not None and not periodic.due(now or timezone.now()):
                report.idle.append(periodic.func)
                continue
            if not periodic.inline:
                timeout = max(60, int(periodic.every_s) * 4)
                if queueing.enqueue(periodic.func, queue="default", job_timeout=timeout):
                    report.enqueued.append(periodic.func)
                continue
            started = time.monotonic()
            run(periodic.func)
            report.ran.append(periodic.func)
            log.debug("scheduling.duty_ran", duty=periodic.func, seconds=round(time.monotonic() - started, 3))
        except RedisError:
            raise  # the whole tick waits for Redis (Ticker.run logs it once)
        except Exception:
            # A duty's failure (a bug, the database gone) is said and the next duty goes on; the
            # next tick tries it again.
            log.exception("scheduling.duty_failed", duty=periodic.func)
            report.failed.append(periodic.func)
            close_old_connections()
    # A whole pass (a duty's own failure included: it is logged and retried): the scrape's
    # saga_periodic_last_tick_timestamp_seconds, which SagaPeriodicStale watches.
    recovery_metrics.periodic_ticked(redis, time.time())
    return report


class Ticker(threading.Thread):
    """Daemon thread: it dies with the worker process, and a new worker starts a new one. Its
    database connection is its own (Django's are per thread); forked work horses never use it."""

    def __init__(self, run: Runner) -> None:
        super().__init__(name="saga-periodic-ticker", daemon=True)
        self._run = run
        self._stop_event = threading.Event()

    def run(self) -> None:
        interval = max(0.2, min(p.every_s for p in periodic_jobs()))
        # On this thread's own connection, whichever server connection a pooler gives it: set per
        # transaction, never on the session (infra.statement_bounds).
        with connection.execute_wrapper(StatementBound(STATEMENT_TIMEOUT_MS)):
            while not self._stop_event.is_set():
                try:
                    tick(self._run)
                except RedisError as exc:
                    log.warning("scheduling.tick_failed", error=str(exc))
                except Exception:
                    log.exception("scheduling.tick_failed")
                finally:
                    # A connection the pass broke (or one past DB_CONN_MAX_AGE) is not kept.
                    close_old_connections()
                self._stop_event.wait(interval)
        connection.close()

    def stop(self) -> None:
        self._stop_event.set()
