"""Keyed audit chain heads (ledger.audit_signing): the signed heads, append-only like the events
(UPDATE, DELETE and TRUNCATE refused by triggers; ``db_grants`` gives the application SELECT and
INSERT only), and each tenant's signing cursor. Two new tables: nothing existing is rewritten."""

import django.db.models.deletion
import pgtrigger.compiler
import pgtrigger.migrations
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0021_runs_page_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditSignCursor',
            fields=[
                ('tenant', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+', serialize=False, to='ledger.tenant')),
                ('done_snapshot', models.TextField(blank=True, default='')),
                ('batch_snapshot', models.TextField(blank=True, default='')),
                ('batch_after_chain', models.CharField(blank=True, default='', max_length=64)),
                ('signed_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='SignedHead',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('chain', models.CharField(max_length=64)),
                ('position', models.BigIntegerField()),
                ('event_id', models.BigIntegerField()),
                ('head', models.CharField(max_length=64)),
                ('signed_at', models.DateTimeField()),
                ('key_id', models.CharField(max_length=16)),
                ('reason', models.CharField(choices=[('interval', 'Interval'), ('archive', 'Archive')], default='interval', max_length=16)),
                ('signature', models.CharField(max_length=64)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='ledger.tenant')),
            ],
            options={
                'indexes': [models.Index(fields=['event_id'], name='signed_head_event')],
                'constraints': [models.UniqueConstraint(fields=('chain', 'position'), name='signed_head_chain_position')],
            },
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='signedhead',
            trigger=pgtrigger.compiler.Trigger(name='signed_head_append_only', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'pgtrigger: Cannot update or delete rows from % table', TG_TABLE_NAME;", hash='303ac518817484844663aa6416a65c8ed06d1d8a', operation='UPDATE OR DELETE', pgid='pgtrigger_signed_head_append_only_c55a4', table='ledger_signedhead', when='BEFORE')),
        ),
        pgtrigger.migrations.AddTrigger(
            model_name='signedhead',
            trigger=pgtrigger.compiler.Trigger(name='signed_head_no_truncate', sql=pgtrigger.compiler.UpsertTriggerSql(func="RAISE EXCEPTION 'Signed audit heads are append-only: TRUNCATE of % is refused', TG_TABLE_NAME;", hash='3e836d611cfd34b9748ddfc0082fa331233f49f9', level='STATEMENT', operation='TRUNCATE', pgid='pgtrigger_signed_head_no_truncate_d7558', table='ledger_signedhead', when='BEFORE')),
        ),
    ]
