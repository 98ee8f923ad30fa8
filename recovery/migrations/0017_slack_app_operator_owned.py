from django.db import migrations, models


class Migration(migrations.Migration):
    """Whose signing secret a tenant's Slack app has: the installation
    operator's (a press decides) or a tenant admin's (a press is a request to confirm). Existing
    apps were all set by tenant admins or with a per-tenant secret: not operator-owned."""

    dependencies = [
        ("recovery", "0016_notification_sweep_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="slackapp",
            name="operator_owned",
            field=models.BooleanField(default=False, db_default=False),
        ),
        migrations.AlterField(
            model_name="slackapp",
            name="signing_secret",
            field=models.CharField(blank=True, max_length=200),
        ),
    ]
