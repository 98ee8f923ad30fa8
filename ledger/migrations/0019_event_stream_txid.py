"""The audit stream's position (recovery/audit_stream): the transaction that wrote each event.

``stream_txid`` (xid8, ``pg_current_xact_id()``) is not a model field: nothing in Python writes or
reads it but the stream's reader, so the ORM and ``saga_event_insert`` leave it out of their
INSERTs and the column's default fills it. Expand only: a nullable column (events written before
this migration have none and count as delivered to a sink configured later only by the sink's
first pass, which takes every event), its default set in a second statement so no row is
rewritten, and a partial index built CONCURRENTLY. The reader asks "which events did transactions
that committed after my last snapshot write, for this tenant": that is a range on
(tenant, stream_txid) (docs/OPERATIONS.md, "Audit stream").
"""

from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("ledger", "0018_json_columns_by_orjson")]

    operations = [
        # Reversed, the column stays (nullable, without its default: the code before this
        # migration never names it); dropping it would be a contract step.
        migrations.RunSQL(
            "ALTER TABLE ledger_event ADD COLUMN IF NOT EXISTS stream_txid xid8", migrations.RunSQL.noop
        ),
        migrations.RunSQL(
            "ALTER TABLE ledger_event ALTER COLUMN stream_txid SET DEFAULT pg_current_xact_id()",
            "ALTER TABLE ledger_event ALTER COLUMN stream_txid DROP DEFAULT",
        ),
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS event_tenant_stream_txid "
            "ON ledger_event (tenant_id, stream_txid) WHERE stream_txid IS NOT NULL",
            "DROP INDEX CONCURRENTLY IF EXISTS event_tenant_stream_txid",
        ),
    ]
