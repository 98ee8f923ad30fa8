"""The recovery engine's Prometheus metrics.

Two kinds. Counters and histograms that move where the thing happens (an unwind step's outcome,
the time its compensator took), in whichever process does it, kept in the multiprocess files
(``infra.metrics``). And gauges read from PostgreSQL and Redis when Prometheus scrapes
(``ScrapeCollector``), never kept in a process: open items, pending approvals, the notification
outbox, unwinds in flight, the audit stream's lag per sink, the RQ queues and workers, the
periodic ticker's last pass. Each is one indexed query or one Redis call (the audit stream's: one
per sink and tenant, as its dashboard page reads them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import django_rq
import structlog
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Min, Q
from django.utils import timezone
from prometheus_client import Counter, Histogram
from prometheus_client.context_managers import Timer
from prometheus_client.core import GaugeMetricFamily, Metric
from rq import worker_registration
from rq.utils import missing_keys

from infra import metrics as process_metrics
from ledger.models import Tenant
from recovery.audit_stream import delivery as audit_stream
from recovery.models import Approval, Notification, RecoveryItem, Unwind, UnwindStep

log = structlog.get_logger(__name__)

# The multiprocess mode is set up before the metrics below exist.
assert process_metrics.MULTIPROCESS_DIR

# --- Moved where it happens -------------------------------------------------------------------

# A step's outcomes: its final states, and "retry" for an attempt that failed and is tried again.
STEP_OUTCOMES = ("done", "failed", "drifted", "skipped", "retry")
_RETRY_KIND = "step.retry_scheduled"

UNWIND_STEPS = Counter(
    "saga_unwind_steps",
    "Unwind step outcomes, counted when they commit: done, failed, drifted, skipped, or retry "
    "(an attempt failed and the step is tried again).",
    ["outcome"],
)
UNWIND_STEP_SECONDS = Histogram(
    "saga_unwind_step_duration_seconds",
    "How long one attempt of one unwind step took: its compensator's call, with its checks.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0),
)
_STEPS: dict[str, Callable[[], None]] = {
    outcome: UNWIND_STEPS.labels(outcome).inc for outcome in STEP_OUTCOMES
}


def step_moved(*, to: str, kind: str) -> None:
    """A step's compare-and-set to ``to`` (audited as ``kind``) succeeded in this transaction:
    an outcome is counted once it commits."""
    increment = _STEPS.get("retry" if kind == _RETRY_KIND else to)
    if increment is not None:
        transaction.on_commit(increment)


def step_attempt_timer() -> Timer:
    """Around one attempt of one step (``with step_attempt_timer(): ...``)."""
    return UNWIND_STEP_SECONDS.time()


# --- Read when scraped ------------------------------------------------------------------------

# An approval this close to its expiry counts as "expiring soon".
EXPIRING_SOON = timedelta(hours=1)
# One scrape must not hold a database connection long, whatever the tables' size.
_STATEMENT_TIMEOUT_MS = 5000


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels or [])


class ScrapeCollector:
    """The gauges ``GET /metrics`` reads from PostgreSQL and Redis at each scrape. A dependency
    that does not answer leaves its gauges out and sets ``saga_database_up`` or ``saga_redis_up``
    to 0: the scrape itself still succeeds."""

    def collect(self) -> Iterator[Metric]:
        database_up = _gauge("saga_database_up", "1 when PostgreSQL answered this scrape's queries, else 0.")
        try:
            families = _database_families(timezone.now())
        except Exception:  # noqa: BLE001 - any failure means "down"; the scrape must still answer
            log.warning("metrics.database_unavailable", exc_info=True)
            families = []
        database_up.add_metric([], 1.0 if families else 0.0)
        yield database_up
        yield from families
        redis_up = _gauge("saga_redis_up", "1 when Redis answered this scrape's calls, else 0.")
        try:
            families = _redis_families()
        except Exception:  # noqa: BLE001
            log.warning("metrics.redis_unavailable", exc_info=True)
            families = []
        redis_up.add_metric([], 1.0 if families else 0.0)
        yield redis_up
        yield from families


def _database_families(now: datetime) -> list[Metric]:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {_STATEMENT_TIMEOUT_MS}")
        slugs = dict(Tenant.objects.values_list("pk", "slug"))
        return [
            *_items_families(slugs),
            *_approvals_families(slugs, now),
            *_notifications_families(now),
            *_unwinds_families(now),
            *_audit_stream_families(slugs, now),
        ]


def _items_families(slugs: dict[int, str]) -> list[Metric]:
    # Only unresolved items are read (index recovery_status_opened): a small set beside the
    # resolved history, whatever its size.
    counts = {
        (row["tenant_id"], row["reason"]): row["n"]
        for row in RecoveryItem.objects.filter(status__in=RecoveryItem.UNRESOLVED)
        .order_by()
        .values("tenant_id", "reason")
        .annotate(n=Count("pk"))
    }
    items = _gauge(
        "saga_recovery_items_open",
        "Recovery items waiting for a decision or its completion (open or claimed), by tenant and reason.",
        ["tenant", "reason"],
    )
    for pk, slug in slugs.items():
        for reason in RecoveryItem.Reason.values:
            items.add_metric([slug, reason], float(counts.get((pk, reason), 0)))
    return [items]


def _approvals_families(slugs: dict[int, str], now: datetime) -> list[Metric]:
    # Pending approvals only (index approval_expiry: status, expires_at).
    rows: dict[int, dict[str, Any]] = {
        row["tenant_id"]: dict(row)
        for row in Approval.objects.filter(status=Approval.Status.PENDING)
        .order_by()
        .values("tenant_id")
        .annotate(
            n=Count("pk"),
            soon=Count("pk", filter=Q(expires_at__lte=now + EXPIRING_SOON)),
            oldest=Min("created_at"),
        )
    }
    pending = _gauge("saga_approvals_pending", "Approvals waiting for a person, by tenant.", ["tenant"])
    soon = _gauge(
        "saga_approvals_expiring_soon",
        "Pending approvals that expire within the next hour, by tenant.",
        ["tenant"],
    )
    oldest = _gauge(
        "saga_approval_oldest_pending_seconds",
        "Age of the tenant's oldest pending approval (0 when none is pending).",
        ["tenant"],
    )
    for pk, slug in slugs.items():
        row = rows.get(pk, {})
        pending.add_metric([slug], float(row.get("n", 0)))
        soon.add_metric([slug], float(row.get("soon", 0)))
        oldest.add_metric([slug], _age(now, row.get("oldest")))
    return [pending, soon, oldest]


def _notifications_families(now: datetime) -> list[Metric]:
    # The undelivered rows only, by their partial index (notification_undelivered).
    row = Notification.objects.filter(
        status__in=(Notification.Status.PENDING, Notification.Status.SENDING)
    ).aggregate(n=Count("pk"), due=Min("next_attempt_at"))
    pending = _gauge(
        "saga_notifications_pending",
        "The notification outbox's backlog: notifications not yet delivered (pending or being sent).",
    )
    pending.add_metric([], float(row["n"]))
    overdue = _gauge(
        "saga_notification_oldest_due_seconds",
        "How long the most overdue undelivered notification has been due (0 when none is).",
    )
    overdue.add_metric([], _age(now, row["due"]))
    return [pending, overdue]


def _unwinds_families(now: datetime) -> list[Metric]:
    counts = dict(
        Unwind.objects.filter(status__in=(Unwind.Status.RUNNING, Unwind.Status.PAUSED))
        .order_by()
        .values_list("status")
        .annotate(n=Count("pk"))
    )
    active = _gauge(
        "saga_unwinds_active",
        "Unwinds in progress: running, or paused while a step waits for a person.",
        ["status"],
    )
    for status in (Unwind.Status.RUNNING, Unwind.Status.PAUSED):
        active.add_metric([status], float(counts.get(status, 0)))
    # Steps handed to a worker (index step_status_lease: status first): a step queued or running
    # for long means no worker is carrying it out.
    oldest = UnwindStep.objects.filter(
        status__in=(UnwindStep.Status.QUEUED, UnwindStep.Status.RUNNING)
    ).aggregate(at=Min("updated_at"))["at"]
    in_flight = _gauge(
        "saga_unwind_step_oldest_in_flight_seconds",
        "How long the oldest unwind step queued for or running on a worker has been so (0 when none is).",
    )
    in_flight.add_metric([], _age(now, oldest))
    return [active, in_flight]


def _audit_stream_families(slugs: dict[int, str], now: datetime) -> list[Metric]:
    """Each sink's lag per tenant (the installation's sinks, ``syslog`` and ``hec``, carry every
    tenant; a tenant's own, ``tenant:<id>``, its tenant only): the Audit stream page's own reading.
    No sink configured: no series, and two small queries (the tenants, their sinks). In a savepoint
    of its own: a sink's first pass, before it has delivered anything, counts every event of the
    tenant, which at size may outlast the statement timeout; then only these two families are left
    out (logged), not the scrape's other gauges."""
    events = _gauge(
        "saga_audit_stream_undelivered_events",
        "Audit events not yet delivered to the sink (0 when it has every one), by sink and tenant.",
        ["sink", "tenant"],
    )
    lag = _gauge(
        "saga_audit_stream_lag_seconds",
        "Age of the oldest audit event not yet delivered to the sink (0 when it has every one), "
        "by sink and tenant.",
        ["sink", "tenant"],
    )
    try:
        with transaction.atomic():
            statuses = audit_stream.sink_statuses(tenant_ids=list(slugs))
    except Exception:  # noqa: BLE001 - the other gauges still answer
        log.warning("metrics.audit_stream_lag_unavailable", exc_info=True)
        return []
    for status in statuses:
        labels = [status.sink.name, status.tenant.slug]
        events.add_metric(labels, float(status.behind))
        lag.add_metric(labels, _age(now, status.oldest_undelivered_at))
    return [events, lag]


def _age(now: datetime, since: datetime | None) -> float:
    return max((now - since).total_seconds(), 0.0) if since is not None else 0.0


# The periodic ticker's last whole pass (recovery.scheduling): the unix time, in Redis, so the
# web's scrape reads one value for the whole deployment, however many workers tick.
PERIODIC_LAST_TICK_KEY = "saga:periodic:last-tick"


def periodic_ticked(redis: Any, at: float) -> None:
    """A ticker finished a pass at ``at`` (``time.time()``)."""
    redis.set(PERIODIC_LAST_TICK_KEY, repr(at))


def _redis_families() -> list[Metric]:
    jobs = _gauge("saga_rq_queue_jobs", "Jobs waiting in each RQ queue.", ["queue"])
    workers = _gauge(
        "saga_rq_workers",
        "RQ workers alive and serving each queue (registered, their heartbeat key not expired).",
        ["queue"],
    )
    for name in settings.RQ_QUEUES:
        queue = django_rq.get_queue(name)
        jobs.add_metric([name], float(queue.count))
        # Read only: RQ's own cleanup of the registry is not run from a scrape.
        keys = sorted(worker_registration.get_keys(queue=queue))
        workers.add_metric([name], float(len(keys) - len(missing_keys(queue.connection, keys))))
    tick = _gauge(
        "saga_periodic_last_tick_timestamp_seconds",
        "Unix time of the last whole pass of the periodic duties by any worker's ticker (0 when "
        "none is recorded: no ticker has run since Redis was last emptied).",
    )
    last = django_rq.get_connection("default").get(PERIODIC_LAST_TICK_KEY)
    tick.add_metric([], float(last) if last else 0.0)
    return [jobs, workers, tick]
