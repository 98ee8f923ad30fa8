"""Recovery items resolved lately, per tenant, for the insights page's time to resolve
(``dashboard.selectors.insights``): it counts and averages the items a tenant resolved in the last
seven days. Without this index that is a scan of every recovery item, which grow with failures for
as long as runs are kept (the "At size" benchmark: ``Seq Scan on recovery_recoveryitem``). Partial
(resolved items only) and covering (``opened_at``, ``id``): the page reads the index alone.

Raw SQL and ``CONCURRENTLY`` for the same reasons as 0002: a tuning concern that must not lock a
production table while it builds.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("recovery", "0014_notification_finished_index")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS recovery_resolved_recent "
            "ON recovery_recoveryitem (tenant_id, resolved_at) INCLUDE (opened_at, id) "
            "WHERE status = 'resolved'",
            "DROP INDEX CONCURRENTLY IF EXISTS recovery_resolved_recent",
        ),
    ]
