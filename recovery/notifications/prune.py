"""Pruning the notification outbox: rows that are finished — delivered, dropped (no longer
relevant when their turn came) or failed for good (out of attempts, or refused by their channel) —
once their last change is older than ``SAGA_NOTIFICATION_RETENTION`` (``ledger.prune_windows``:
30 days by default, never less than one). A row still to be sent (pending, or being sent and
retried) is never pruned, whatever its age. A periodic job of the worker's and ``manage.py prune``;
batches as ``ledger.pruning`` walks them, through the partial index ``notification_finished``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from infra.conf import saga
from ledger import pruning
from ledger.prune_windows import NOTIFICATIONS
from recovery.models import Notification

FINISHED = (Notification.Status.DELIVERED, Notification.Status.DROPPED, Notification.Status.FAILED)
_FINISHED_SQL = ", ".join(f"'{status}'" for status in FINISHED)

STORE = pruning.Store(
    name="notifications",
    table=Notification._meta.db_table,
    time="updated_at",
    # The partial index's own predicate (recovery/0014), so the candidates are read from it.
    candidates=f"status IN ({_FINISHED_SQL})",
    keep=f"t.status NOT IN ({_FINISHED_SQL})",
)


def notifications_cutoff(now: datetime | None = None) -> datetime:
    window_s = max(saga().notification_retention_s, NOTIFICATIONS.floor_s)
    return (now or timezone.now()) - timedelta(seconds=window_s)


def notifications_prune(
    *, now: datetime | None = None, batch_size: int = pruning.BATCH, dry_run: bool = False
) -> int:
    """Delete the finished notifications past the window, ``batch_size`` per statement; return
    how many (a dry run: how many would go). Safe to run concurrently and repeatedly."""
    return pruning.store_prune(
        STORE, cutoff=notifications_cutoff(now), batch_size=batch_size, dry_run=dry_run
    )
