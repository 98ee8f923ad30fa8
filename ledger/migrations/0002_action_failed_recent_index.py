"""The metrics page's "top failing tools" reads failed actions updated inside a window (24 h to
30 d). The only usable index was (tenant, status), which returns every failed action ever and
filters the window afterwards: a cost that grows with the ledger's whole history. This partial
index holds only failed/unknown/compensation_failed actions, ordered by ``updated_at``, so the
window is an index range (found by `make bench`, see docs/BENCHMARKS.md). Recording an action
(status ``planned``) does not touch it.

Raw SQL with no model state on purpose (partial, tuning only), built ``CONCURRENTLY`` so a
production ledger stays writable (hence non-atomic).
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("ledger", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS action_failed_updated "
            "ON ledger_action (updated_at) WHERE status IN ('failed', 'unknown', 'compensation_failed')",
            "DROP INDEX CONCURRENTLY IF EXISTS action_failed_updated",
        ),
    ]
