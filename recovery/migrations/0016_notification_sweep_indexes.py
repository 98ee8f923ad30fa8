"""The notification sweep's two questions, each from its own partial index
(``recovery.sweeper.notifications_sweep``): the pending rows in (next_attempt_at, id) order, the
order the sweep reads its bounded batches in and resumes from, and the sending rows by when
their lease expires. Each holds only the rows still to be sent, so a pass costs the same however
many rows the outbox has delivered (``notification_undelivered``, on both statuses, stays for
the code of the release before).

Raw SQL and ``CONCURRENTLY`` for the same reasons as 0002: a tuning concern that must not lock a
production table while it builds.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("recovery", "0015_recovery_resolved_recent")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_pending_due "
            "ON recovery_notification (next_attempt_at, id) WHERE status = 'pending'",
            "DROP INDEX CONCURRENTLY IF EXISTS notification_pending_due",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_sending_lease "
            "ON recovery_notification (lease_expires_at) WHERE status = 'sending'",
            "DROP INDEX CONCURRENTLY IF EXISTS notification_sending_lease",
        ),
    ]
