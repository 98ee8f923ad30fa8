"""``saga_archived_run_events_delete`` (ledger/0024) redefined with ``search_path = pg_catalog,
pg_temp``.

It runs as its owner (SECURITY DEFINER), and 0024's search_path listed ``public``, a schema an
upgraded cluster lets every role create objects in. A ``public.=(varchar, text)`` created by the
application's role is an exact match for ``ledger_run.id = p_run_id``, so PostgreSQL picked it over
``pg_catalog.=(text, text)`` and ran it as the owner: it could delete the whole audit log and grant
the role DELETE and TRUNCATE. Now only ``pg_catalog`` is searched (``pg_temp`` named last, where
PostgreSQL never looks for functions or operators anyway), and every table is named
``public.<table>``; ``db_grants`` also revokes CREATE on ``public``. The body is otherwise 0024's
(``ledger/sql/saga_archived_run_events_delete.v2.sql``; reversed, version 1 again: a function
body has no state of its own to migrate back).
"""

from django.db import migrations

from ledger.sql.versions import LoadFunction


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0024_archived_run_events_delete"),
    ]

    operations = [
        LoadFunction(
            "saga_archived_run_events_delete",
            2,
            sha256="6b5bf0c9cd9c6bc046accbbf62d8e03dc7cdb0d36fa7cc77e2b9f0278be4f66b",
            previous=(1, "362fc68ca5f9664d057f87d61e49d615deadea22e06066428d27c803d4c45c25"),
        ),
    ]
