"""Idempotency-Key records (the API's replay store, ``saga_admin/api/idempotency.py``): pruning
them once they are older than the TTL. A periodic job of the worker's; the HTTP side owns how a
record is claimed and replayed."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from ledger.conf import saga
from ledger.models import IdempotencyRecord

# The contract keeps keys at least 24 h, whatever the setting says.
MIN_TTL_H = 24


def idempotency_records_prune(*, now: datetime | None = None, batch_size: int = 5000) -> int:
    """Delete records older than the TTL (never less than 24 h). A periodic job; safe to run
    concurrently and repeatedly. Deletes in batches so a large backlog does not hold one huge
    transaction."""
    ttl_h = max(saga().idempotency_key_ttl_h, MIN_TTL_H)
    cutoff = (now or timezone.now()) - timedelta(hours=ttl_h)
    deleted = 0
    while True:
        batch = list(
            IdempotencyRecord.objects.filter(created_at__lt=cutoff).values_list("pk", flat=True)[:batch_size]
        )
        if not batch:
            return deleted
        count, _ = IdempotencyRecord.objects.filter(pk__in=batch).delete()
        deleted += count
