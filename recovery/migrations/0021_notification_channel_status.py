"""The outbox's per-channel status (``dashboard.selectors.outbox.channel_statuses``): each
channel's newest delivered and newest failed row, and its undelivered count, each an index range
read from its end — a tenant's channel by its id, an installation channel (``channel`` NULL) by
its tenant and name — so the page costs the same however many rows the outbox holds.

Raw SQL and ``CONCURRENTLY`` for the same reasons as 0002: a tuning concern that must not lock a
production table while it builds.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("recovery", "0020_teams_channel")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_channel_latest "
            "ON recovery_notification (channel_id, status, created_at DESC) WHERE channel_id IS NOT NULL",
            "DROP INDEX CONCURRENTLY IF EXISTS notification_channel_latest",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS notification_env_channel_latest "
            "ON recovery_notification (tenant_id, channel_name, status, created_at DESC) "
            "WHERE channel_id IS NULL",
            "DROP INDEX CONCURRENTLY IF EXISTS notification_env_channel_latest",
        ),
    ]
