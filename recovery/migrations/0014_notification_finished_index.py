"""The notification outbox's finished rows by their last change, for pruning them
(``recovery.notifications.prune``): the prune reads the rows past the window in (updated_at, id)
order from this index, batch after batch, instead of a whole-table scan. Partial: the rows still
to be sent are not in it (they have their own, ``notification_undelivered``).

Raw SQL and ``CONCURRENTLY`` for the same reasons as 0002: a tuning concern that must not lock a
production table while it builds.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("recovery", "0013_approval_deadlines")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_finished "
            "ON recovery_notification (updated_at, id) "
            "WHERE status IN ('delivered', 'dropped', 'failed')",
            "DROP INDEX CONCURRENTLY IF EXISTS notification_finished",
        ),
    ]
