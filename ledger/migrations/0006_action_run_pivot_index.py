"""Every append of a compensatable action looks for the run's pivot, its first irreversible action
(ledger.services.pivot_warnings_for_new). Through (run_id, seq) that walks all of the run's
actions, so a run's n-th append costs O(n). This partial index holds only irreversible actions, so
the lookup is one index probe; appends of other actions do not touch it.

Raw SQL with no model state on purpose (partial, tuning only), built ``CONCURRENTLY`` so a
production ledger stays writable (hence non-atomic), like 0002.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("ledger", "0005_policy_stamp")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS action_run_pivot "
            "ON ledger_action (run_id, seq) WHERE action_class = 'external_irreversible'",
            "DROP INDEX CONCURRENTLY IF EXISTS action_run_pivot",
        ),
    ]
