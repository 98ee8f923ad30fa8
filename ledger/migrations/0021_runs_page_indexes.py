"""The dashboard's Runs page (``ledger.run_filter``): every run, newest first, in keyset pages, at
ten million runs.

- ``run_newest`` (created_at DESC, id DESC): the page's order and its cursor, a row comparison
  ``(created_at, id) < (…, …)``, are one range of this index across all of an operator's tenants;
  a time window is a range of it too. The older (tenant, created_at) index has no id, so a page
  after a cursor re-read every run sharing the cursor's start time, and across several tenants
  it could not yield the runs in order at all (every run of those tenants was sorted).
- ``run_search_trgm``: a trigram index over the run's request and external id (upper-cased, as
  ``icontains`` compares), so "text in the request" is a bitmap of matching runs instead of a
  read of every run. Like recovery/0003, it needs pg_trgm: a server without the contrib
  extensions gets no index and the search reads the runs newest first.

Raw SQL with no model state on purpose (a tuning concern, like 0002), built ``CONCURRENTLY`` so
a production ledger stays writable (hence non-atomic).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

SEARCH_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS run_search_trgm ON ledger_run "
    "USING gin (upper(request) gin_trgm_ops, upper(external_id) gin_trgm_ops)"
)


def create_search_index(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        cursor.execute(SEARCH_INDEX)


def drop_search_index(apps: Any, schema_editor: Any) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("DROP INDEX CONCURRENTLY IF EXISTS run_search_trgm")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("ledger", "0020_approval_deadlines")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS run_newest ON ledger_run (created_at DESC, id DESC)",
            "DROP INDEX CONCURRENTLY IF EXISTS run_newest",
        ),
        migrations.RunPython(create_search_index, drop_search_index),
    ]
