"""Indexes the dashboard needs at scale (found by `make bench`, see docs/BENCHMARKS.md).

- The queue's default order is newest unresolved first. With 10k open items among many resolved
  ones, no existing index yields unresolved items in ``opened_at`` order across an operator's
  tenants, so PostgreSQL fetched every unresolved item, hash-joined it with a sequential scan of
  all runs, sorted, and kept 50 (~50 ms at 100k runs). This partial index lets it walk the
  newest unresolved items in order and stop after one page (~2 ms), and it stays small because
  resolved items — the bulk of the table over time — are not in it.
- The approval inbox lists pending approvals oldest first; the queue marks items whose run has a
  pending approval. Both read only pending rows, which are few next to decided ones.

Raw SQL with no model state on purpose: the indexes are partial and a tuning concern, and
``CONCURRENTLY`` keeps a production table writable while they build (hence non-atomic).
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("recovery", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS recovery_unresolved_newest "
            "ON recovery_recoveryitem (opened_at DESC, id DESC) WHERE status IN ('open', 'claimed')",
            "DROP INDEX CONCURRENTLY IF EXISTS recovery_unresolved_newest",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS recovery_approval_pending_created "
            "ON recovery_approval (created_at, id) WHERE status = 'pending'",
            "DROP INDEX CONCURRENTLY IF EXISTS recovery_approval_pending_created",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS recovery_approval_pending_run "
            "ON recovery_approval (run_id) WHERE status = 'pending'",
            "DROP INDEX CONCURRENTLY IF EXISTS recovery_approval_pending_run",
        ),
    ]
