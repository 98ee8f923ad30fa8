"""The head of each run's audit chain on the run row (see ledger.audit.audit_record), backfilled
from the chain's latest event so the next event links to it exactly as before."""

from django.db import migrations, models

BACKFILL = """
UPDATE ledger_run AS run
   SET audit_head = latest.hash
  FROM (SELECT DISTINCT ON (chain) chain, hash
          FROM ledger_event
         WHERE chain LIKE 'run:%'
         ORDER BY chain, id DESC) AS latest
 WHERE latest.chain = 'run:' || run.id
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0002_action_failed_recent_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="audit_head",
            field=models.CharField(blank=True, default="", editable=False, max_length=64),
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
    ]
