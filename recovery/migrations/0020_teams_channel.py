from django.db import migrations, models

_KINDS = [
    ("email", "E-mail"),
    ("webhook", "Signed webhook"),
    ("slack", "Slack incoming webhook"),
    ("pagerduty", "PagerDuty (Events API v2)"),
    ("teams", "Microsoft Teams (Workflows webhook)"),
]


class Migration(migrations.Migration):
    """A channel kind for Microsoft Teams: a Workflows or incoming-webhook URL that takes an
    Adaptive Card. The kind's check constraint is widened (dropped and added again: the previous
    release's code writes only kinds it allows); the rest is choices, which the database does not
    see."""

    dependencies = [
        ("recovery", "0019_away_delegation"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="notificationchannel", name="channel_kind_valid"),
        migrations.AddConstraint(
            model_name="notificationchannel",
            constraint=models.CheckConstraint(
                condition=models.Q(kind__in=["email", "webhook", "slack", "pagerduty", "teams"]),
                name="channel_kind_valid",
            ),
        ),
        migrations.AlterField(
            model_name="notificationchannel",
            name="kind",
            field=models.CharField(choices=_KINDS, max_length=16),
        ),
        migrations.AlterField(
            model_name="notification",
            name="kind",
            field=models.CharField(choices=_KINDS, max_length=16),
        ),
    ]
