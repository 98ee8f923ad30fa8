"""A covering index for the aggregates over every unresolved item (found by `make bench`).

The queue's groups panel (similar failures by signature) and the metrics page's open-by-risk and
open-by-reason counts read every unresolved item of the operator's tenants. No index held the
columns they need, so each was a sequential scan of the whole items table: resolved history
included, which is most of it on a long-lived installation. This partial index holds exactly the
unresolved items and the columns those aggregates read, so they become index-only scans that
never touch the table (given the visibility map autovacuum keeps), ~1.5 ms for 10k open items.

Raw SQL and ``CONCURRENTLY`` for the same reasons as 0002: a tuning concern that must not lock a
production table while it builds.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("recovery", "0003_dashboard_search")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS recovery_unresolved_groups "
            "ON recovery_recoveryitem (tenant_id, signature) "
            "INCLUDE (id, risk, reason, opened_at, failed_action_id) "
            "WHERE status IN ('open', 'claimed')",
            "DROP INDEX CONCURRENTLY IF EXISTS recovery_unresolved_groups",
        ),
    ]
