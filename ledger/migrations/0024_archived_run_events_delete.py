"""The one way a run's audit events leave the log: ``saga_archived_run_events_delete(run_id)``,
called by retention (``recovery.archive.remove``) in the transaction that records the archive.

The log refuses DELETE (its append-only trigger) and the application's least-privileged role has
no DELETE on it (``manage.py db_grants``). This function runs as its owner (the role that migrates,
SECURITY DEFINER, its search_path pinned), is executable only by the roles ``db_grants`` grants it
to, and deletes the events of chain ``run:<id>`` only when the archive of exactly that chain is
recorded in the same database: a tombstone (``ledger_archivedrun``) whose head is the chain's
newest hash and whose count is its length, a signed head (``ledger_signedhead``) at that position
with that head, and the tenant-chain event ``run.archived`` naming the run and that head. It locks
the run's row first, so no event can join the chain meanwhile, and lets the append-only trigger
pass for its own DELETE only (``pgtrigger.ignore``, set for the statement and restored).
Its SQL is ``ledger/sql/saga_archived_run_events_delete.v1.sql``.
"""

from django.db import migrations

from ledger.sql.versions import LoadFunction


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0023_archived_runs"),
    ]

    operations = [
        LoadFunction(
            "saga_archived_run_events_delete",
            1,
            sha256="362fc68ca5f9664d057f87d61e49d615deadea22e06066428d27c803d4c45c25",
            reverse_sql="DROP FUNCTION IF EXISTS saga_archived_run_events_delete(text);",
        ),
    ]
