"""The tool-policy stamp (ledger.models.PolicyStamp): its table, the sequence its versions come
from, its row, and the trigger on ledger_toolpolicy that moves it."""

import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0004_run_audit_head_db_default"),
    ]

    operations = [
        migrations.CreateModel(
            name="PolicyStamp",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("version", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunSQL(
            "CREATE SEQUENCE ledger_policystamp_version_seq;"
            " INSERT INTO ledger_policystamp (id, version) VALUES (1, nextval('ledger_policystamp_version_seq'));",
            reverse_sql="DROP SEQUENCE ledger_policystamp_version_seq;",
        ),
        pgtrigger.migrations.AddTrigger(
            model_name="toolpolicy",
            trigger=pgtrigger.compiler.Trigger(
                name="toolpolicy_stamp",
                sql=pgtrigger.compiler.UpsertTriggerSql(
                    func="INSERT INTO ledger_policystamp (id, version) VALUES (1, nextval('ledger_policystamp_version_seq')) ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version; RETURN NULL;",
                    hash="d255c818ba3c9f49d21f8c505eec95fe77ba06eb",
                    level="STATEMENT",
                    operation="INSERT OR UPDATE OR DELETE OR TRUNCATE",
                    pgid="pgtrigger_toolpolicy_stamp_65179",
                    table="ledger_toolpolicy",
                    when="AFTER",
                ),
            ),
        ),
    ]
