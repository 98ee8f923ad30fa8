"""Pruning a table that grows with traffic, in bounded batches, never in one long transaction.

One walk for every pruned store (``ledger.services.idempotency``, ``recovery.notifications.prune``):

1. the next batch of candidates — rows older than the cutoff, in (time, id) order after the last
   batch's end, read from an index on the time column (a keyset: each batch starts where the last
   ended, so rows the store keeps are read once per run, not once per batch);
2. one ``DELETE`` of that batch's range (through the same index, then by primary key), checking
   the store's own condition (what must never go: a record of a live action, an undelivered
   notification) and skipping rows another transaction holds (``FOR UPDATE SKIP LOCKED``): two prunes running at once, or a
   request touching a row, never wait on each other, and no row is counted twice.

Each statement is its own short transaction (autocommit), so a prune of millions of rows holds
no lock for longer than one batch and can be stopped at any point: what is deleted stays deleted,
the rest is found by the next run. A dry run walks the same batches and counts instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from infra import metrics

BATCH = 5000
MAX_BATCH = 50_000


@dataclass(frozen=True)
class Store:
    """A prunable table: ``time`` is the column the window counts from (indexed, together with
    ``candidates``, the index's own predicate if partial); ``keep`` is SQL over the row ``t`` that
    is true for a row that must not go, whatever its age."""

    name: str  # the metrics label
    table: str
    time: str
    candidates: str = "TRUE"
    keep: str = "FALSE"
    keep_params: tuple[Any, ...] = ()


def _range(store: Store, *, after: bool) -> str:
    """Rows past the cutoff, within one batch's keyset range (params: cutoff, [after time, after
    id,] last time, last id): a range of the time index."""
    lower = f" AND ({store.time}, id) > (%s, %s)" if after else ""
    return f"{store.time} < %s AND {store.candidates}{lower}"


def candidates_sql(store: Store, *, after: bool) -> str:
    """The next batch's candidates, in (time, id) order (params: cutoff, [after time, after id,]
    limit)."""
    # Every name and clause here is the code's own (a ``Store``), never a caller's: params carry values.
    where = _range(store, after=after)
    return f"SELECT {store.time}, id FROM {store.table} WHERE {where} ORDER BY {store.time}, id LIMIT %s"  # noqa: S608


def delete_sql(store: Store, *, after: bool) -> str:
    """Delete the batch: the rows of its range the store does not keep, skipping any another
    transaction holds (params: the range's, then ``keep_params``). ``ARRAY(…)``: the locked ids
    are computed first, then deleted through the primary key (an ``IN (subquery)`` may be
    planned as a join that reads the whole table)."""
    return (
        f"DELETE FROM {store.table} WHERE id = ANY(ARRAY(SELECT id FROM {store.table} AS t"  # noqa: S608
        f" WHERE {_range(store, after=after)} AND ({store.time}, id) <= (%s, %s)"
        f" AND NOT ({store.keep}) FOR UPDATE SKIP LOCKED))"
    )


def count_sql(store: Store, *, after: bool) -> str:
    """A dry run's count of what ``delete_sql`` would delete (the same params)."""
    return (
        f"SELECT count(*) FROM {store.table} AS t WHERE {_range(store, after=after)}"  # noqa: S608
        f" AND ({store.time}, id) <= (%s, %s) AND NOT ({store.keep})"
    )


def store_prune(store: Store, *, cutoff: datetime, batch_size: int = BATCH, dry_run: bool = False) -> int:
    """Delete ``store``'s rows older than ``cutoff`` that it does not keep, ``batch_size`` per
    statement; return how many (a dry run: how many would go, deleting nothing)."""
    if not 1 <= batch_size <= MAX_BATCH:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH}")
    total = 0
    last: tuple[Any, Any] | None = None
    while True:
        after = [] if last is None else list(last)
        with connection.cursor() as cursor:
            cursor.execute(candidates_sql(store, after=last is not None), [cutoff, *after, batch_size])
            rows = cursor.fetchall()
            if not rows:
                return total
            params = [cutoff, *after, rows[-1][0], rows[-1][1], *store.keep_params]
            if dry_run:
                cursor.execute(count_sql(store, after=last is not None), params)
                total += int(cursor.fetchone()[0])
            else:
                cursor.execute(delete_sql(store, after=last is not None), params)
                total += cursor.rowcount
                metrics.rows_pruned(store.name, cursor.rowcount)
        if len(rows) < batch_size:
            return total
        last = (rows[-1][0], rows[-1][1])
