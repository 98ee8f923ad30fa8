"""The metrics page's failing-tools panel as an index-only scan (found by `make bench`).

``action_failed_updated`` (0002) found the window's failed actions, but the panel also reads
each one's tenant and tool, so PostgreSQL fetched one heap page per failed action: ~11k scattered
pages at 1M actions, up to a second with a cold cache. The same partial index with the tenant
tool and id included answers the panel from the index alone; it replaces the old one.
"""

from __future__ import annotations

from django.db import migrations

FAILED = "('failed', 'unknown', 'compensation_failed')"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("ledger", "0006_action_run_pivot_index")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS action_failed_recent "
            f"ON ledger_action (updated_at) INCLUDE (tenant_id, tool, id) WHERE status IN {FAILED}",
            "DROP INDEX CONCURRENTLY IF EXISTS action_failed_recent",
        ),
        migrations.RunSQL(
            "DROP INDEX CONCURRENTLY IF EXISTS action_failed_updated",
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS action_failed_updated "
            f"ON ledger_action (updated_at) WHERE status IN {FAILED}",
        ),
    ]
