"""The queue's substring search, served by an index (found by `make bench`, see docs/BENCHMARKS.md).

The search matched part of the failing tool or of the run's request, an OR across two joined
tables that no index serves: every unresolved item was read with its run and failed action on
every search (a sequential scan of all runs, or ten thousand primary-key lookups at 10k open
items). The item now keeps that text (``search_text``, set where the item's failed action is
set) and a trigram GIN index over unresolved items answers ``LIKE '%term%'``.

The index is raw SQL with no model state, like 0002's: partial, a tuning concern, built
``CONCURRENTLY`` so a production table stays writable (hence non-atomic). pg_trgm is a trusted
extension (PostgreSQL 13+): a database owner may create it. A server built without the contrib
extensions (the embedded PostgreSQL `make run` uses, for one) gets no index: the search still
works, as a scan of the unresolved items.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

# The same rule as recovery.transitions.items.item_search_text, for the items that exist already.
BACKFILL = """
UPDATE recovery_recoveryitem AS item
   SET search_text = lower(
         coalesce((SELECT action.tool FROM ledger_action AS action WHERE action.id = item.failed_action_id), '')
         || E'\\n' || run.request)
  FROM ledger_run AS run
 WHERE run.id = item.run_id AND item.search_text = ''
"""


INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS recovery_unresolved_search "
    "ON recovery_recoveryitem USING gin (search_text gin_trgm_ops) "
    "WHERE status IN ('open', 'claimed')"
)


def create_search_index(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        cursor.execute(INDEX)


def drop_search_index(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("DROP INDEX CONCURRENTLY IF EXISTS recovery_unresolved_search")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("recovery", "0002_queue_inbox_partial_indexes"),
        ("ledger", "0002_action_failed_recent_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="recoveryitem",
            name="search_text",
            field=models.TextField(blank=True, db_default="", default="", editable=False),
        ),
        migrations.RunSQL(BACKFILL, migrations.RunSQL.noop),
        migrations.RunPython(create_search_index, drop_search_index),
    ]
