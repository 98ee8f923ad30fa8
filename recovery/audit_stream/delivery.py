"""Moving the audit stream: a per-sink, per-tenant cursor over the audit log, moved by the
worker's periodic duty (``recovery.jobs.audit_stream_deliver``). Nothing is copied on the append
path: the log is the outbox.

Why a cursor over snapshots, not over event ids: ids are handed out when an event is inserted
and become visible when its transaction commits, so a cursor "up to id N" would skip an event
with a smaller id whose transaction commits after N was read. Each event instead carries the id of
the transaction that wrote it (``stream_txid``, ledger/0019). A cursor holds the snapshot
(``pg_current_snapshot()``) up to which everything is delivered (``done_snapshot``) and the one
being delivered (``batch_snapshot``, with ``batch_after_id`` the last event sent from it). A batch
is the tenant's events committed in the batch snapshot and not in the done one, in id order;
once sent, the batch snapshot becomes the done one. A snapshot's set of committed transactions
never changes, so every event lands in exactly one batch: none skipped, and sent twice only when a
send's outcome was lost (the cursor is saved after the sink took the batch). Within a chain an
event's transaction commits after its predecessor's and inserts it later (the chain's head is
locked), so the order per tenant keeps every chain's order.

The append path pays a column default (``pg_current_xact_id()``) and one partial index entry per
event, whether or not a sink is configured; everything else happens here, in the worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from django.db import connection, transaction
from django.utils import timezone

from infra.conf import saga
from ledger.models import Event, Tenant
from recovery.audit_stream import config, records, transport
from recovery.audit_stream.models import AuditCursor, AuditSink, shown_url

log = structlog.get_logger(__name__)

# Batches one sink and tenant send per pass (then the next pass goes on): bounds a pass's time.
MAX_BATCHES_PER_PASS = 20

# The SQL is constant text: only these constants are spliced in, every value is a parameter.
_NOT_DONE = (
    "(e.stream_txid >= pg_snapshot_xmin(%s::pg_snapshot)"
    " AND NOT pg_visible_in_snapshot(e.stream_txid, %s::pg_snapshot))"
)
_IN_BATCH = "(e.stream_txid IS NULL OR pg_visible_in_snapshot(e.stream_txid, %s::pg_snapshot))"


def _not_done(cursor: AuditCursor) -> tuple[str, list[Any]]:
    if not cursor.done_snapshot:
        return "TRUE", []
    return _NOT_DONE, [cursor.done_snapshot, cursor.done_snapshot]


def _batch(cursor: AuditCursor, limit: int) -> list[Event]:
    not_done, params = _not_done(cursor)
    sql = (
        "SELECT e.* FROM ledger_event e WHERE e.tenant_id = %s AND "  # noqa: S608 - constants only
        f"{not_done} AND {_IN_BATCH} AND e.id > %s ORDER BY e.id LIMIT %s"
    )
    return list(
        Event.objects.raw(
            sql, [cursor.tenant_id, *params, cursor.batch_snapshot, cursor.batch_after_id, limit]
        )
    )


def _snapshot() -> str:
    with connection.cursor() as db:
        db.execute("SELECT pg_current_snapshot()::text")
        return str(db.fetchone()[0])


def backoff_s(failures: int) -> float:
    config_ = saga()
    return float(min(config_.retry_backoff_max_s, config_.retry_backoff_base_s * 2 ** max(0, failures - 1)))


def audit_stream_deliver() -> dict[str, int]:
    """One pass over every sink and tenant (the periodic job). No sink: nothing, not a query more."""
    sinks = config.all_sinks()
    if not sinks:
        return {"sinks": 0, "sent": 0}
    try:
        key = config.audit_key()
    except config.AuditStreamNotConfigured as exc:
        log.error("audit_stream.not_configured", error=str(exc))
        for sink in sinks:
            for tenant in config.tenants_for(sink):
                AuditCursor.objects.update_or_create(
                    sink=sink.name, tenant=tenant, defaults={"last_error": str(exc)}
                )
        return {"sinks": len(sinks), "sent": 0}
    sent = 0
    for sink in sinks:
        for tenant in config.tenants_for(sink):
            sent += sink_deliver(sink, tenant, key=key)
    return {"sinks": len(sinks), "sent": sent}


def sink_deliver(sink: config.Sink, tenant: Tenant, *, key: bytes) -> int:
    """Send one tenant's undelivered events to one sink, batch by batch, each batch's cursor move
    committed after the sink took it. Returns the events sent. A failure stops the pass and sets
    the next attempt's time (backoff); another worker holding the cursor: nothing. A tenant's sink
    removed or changed since the pass read it gets nothing (``config.still_configured``)."""
    if not config.still_configured(sink):
        return 0
    cursor_id = AuditCursor.objects.get_or_create(sink=sink.name, tenant=tenant)[0].pk
    sent = 0
    for _ in range(MAX_BATCHES_PER_PASS):
        with transaction.atomic():
            cursor = AuditCursor.objects.select_for_update(skip_locked=True).filter(pk=cursor_id).first()
            now = timezone.now()
            if cursor is None or (cursor.next_attempt_at is not None and cursor.next_attempt_at > now):
                return sent
            if not config.still_configured(sink):  # under the lock sink_set and sink_remove take too
                return sent
            outcome = _deliver_batch(sink, tenant, cursor, key=key, now=now)
        if outcome is None:
            return sent
        count, finished = outcome
        sent += count
        if finished and not count:
            break  # caught up with a snapshot taken in this pass
    return sent


def _deliver_batch(
    sink: config.Sink, tenant: Tenant, cursor: AuditCursor, *, key: bytes, now: datetime
) -> tuple[int, bool] | None:
    """The cursor's next batch sent and the cursor moved past it (under its row lock): (events
    sent, whether the batch snapshot is done); None when the send failed (recorded on the cursor)."""
    options = config.options()
    limit = max(1, int(options.get("BATCH", 500)))
    interval = timedelta(seconds=float(options.get("HEAD_INTERVAL_S", 60.0)))
    if not cursor.batch_snapshot:
        cursor.batch_snapshot, cursor.batch_after_id = _snapshot(), 0
    events = _batch(cursor, limit)
    finished = len(events) < limit
    messages, head = [], cursor.stream_head
    for n, event in enumerate(events, start=1):
        messages.append(records.event_message(event, tenant=tenant.slug, seq=cursor.position + n))
        head = records.next_head(head, event.hash)
    position = cursor.position + len(events)
    head_due = (
        finished
        and position > 0
        and (cursor.head_signed_at is None or now - cursor.head_signed_at >= interval)
    )
    if head_due:
        messages.append(records.head_message(key, tenant=tenant.slug, position=position, head=head, now=now))
    try:
        transport.send(sink, messages, timeout=float(options.get("TIMEOUT_S", 10.0)))
    except transport.SendFailed as exc:
        cursor.failures += 1
        cursor.next_attempt_at = now + timedelta(seconds=backoff_s(cursor.failures))
        cursor.last_error = str(exc)[:2000]
        cursor.save()
        log.warning("audit_stream.send_failed", sink=sink.name, tenant=tenant.slug, error=str(exc)[:300])
        return None
    cursor.position, cursor.stream_head = position, head
    cursor.failures, cursor.next_attempt_at, cursor.last_error = 0, None, ""
    cursor.batch_after_id = events[-1].id if events else cursor.batch_after_id
    cursor.head_signed_at = now if head_due else cursor.head_signed_at
    if finished:
        cursor.done_snapshot, cursor.batch_snapshot, cursor.batch_after_id = cursor.batch_snapshot, "", 0
    cursor.save()
    return len(events), finished


# --- What the dashboard shows -----------------------------------------------------------------


@dataclass(frozen=True)
class SinkStatus:
    sink: config.Sink
    tenant: Tenant
    position: int
    behind: int
    oldest_undelivered_at: datetime | None
    last_error: str
    next_attempt_at: datetime | None

    @property
    def shown_url(self) -> str:
        return shown_url(self.sink.url)


def _undelivered(cursor: AuditCursor) -> tuple[str, list[Any]]:
    """SQL over the event ``e`` true while the cursor's sink has not had it: not done, and not in
    the batch under way up to where that batch got (params follow)."""
    not_done, params = _not_done(cursor)
    if not cursor.batch_snapshot:
        return f"{not_done}", params
    return (
        f"{not_done} AND NOT ({_IN_BATCH} AND e.id <= %s)",
        [*params, cursor.batch_snapshot, cursor.batch_after_id],
    )


def lag(cursor: AuditCursor) -> tuple[int, datetime | None]:
    """Events of the cursor's tenant not yet delivered to its sink, and the oldest one's time."""
    undelivered, params = _undelivered(cursor)
    sql = (
        "SELECT count(*), min(e.created_at) FROM ledger_event e WHERE e.tenant_id = %s AND "  # noqa: S608 - constants only
        f"{undelivered}"
    )
    with connection.cursor() as db:
        db.execute(sql, [cursor.tenant_id, *params])
        count, oldest = db.fetchone()
    return int(count), oldest


def sink_statuses(*, tenant_ids: list[int]) -> list[SinkStatus]:
    """Every sink that carries these tenants' events, per tenant, with its lag and last error."""
    tenants = {t.pk: t for t in Tenant.objects.filter(pk__in=tenant_ids).order_by("slug")}
    rows = AuditSink.objects.filter(tenant_id__in=tenants, enabled=True).order_by("pk")
    pairs = [(sink, tenant) for sink in config.installation_sinks() for tenant in tenants.values()]
    pairs += [(config.tenant_sink(row), tenants[row.tenant_id]) for row in rows]
    cursors = {
        (c.sink, c.tenant_id): c
        for c in AuditCursor.objects.filter(tenant_id__in=tenants, sink__in={s.name for s, _ in pairs})
    }
    statuses = []
    for sink, tenant in pairs:
        cursor = cursors.get((sink.name, tenant.pk)) or AuditCursor(sink=sink.name, tenant=tenant)
        behind, oldest = lag(cursor)
        statuses.append(
            SinkStatus(
                sink=sink,
                tenant=tenant,
                position=cursor.position,
                behind=behind,
                oldest_undelivered_at=oldest,
                last_error=cursor.last_error,
                next_attempt_at=cursor.next_attempt_at,
            )
        )
    return statuses


def chain_undelivered(tenant: Tenant, chain: str) -> list[str]:
    """The sinks carrying ``tenant``'s stream (the installation's and the tenant's own, enabled)
    that have not yet been sent every event of ``chain`` (their shown URLs). Retention archives a
    run only once every sink has its events (``recovery.archive``)."""
    sinks = config.installation_sinks() + [
        config.tenant_sink(row)
        for row in AuditSink.objects.filter(tenant=tenant, enabled=True).order_by("pk")
    ]
    behind = []
    for sink in sinks:
        cursor = AuditCursor.objects.filter(sink=sink.name, tenant=tenant).first() or AuditCursor(
            sink=sink.name, tenant=tenant
        )
        undelivered, params = _undelivered(cursor)
        sql = (
            "SELECT EXISTS (SELECT 1 FROM ledger_event e WHERE e.tenant_id = %s AND e.chain = %s AND "  # noqa: S608 - constants only
            f"{undelivered})"
        )
        with connection.cursor() as db:
            db.execute(sql, [tenant.pk, chain, *params])
            if db.fetchone()[0]:
                behind.append(shown_url(sink.url))
    return behind
