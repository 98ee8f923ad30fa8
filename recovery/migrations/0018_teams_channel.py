from django.db import migrations, models

KINDS = [
    ("email", "E-mail"),
    ("webhook", "Signed webhook"),
    ("slack", "Slack incoming webhook"),
    ("teams", "Microsoft Teams (Workflows webhook)"),
]


class Migration(migrations.Migration):
    """A channel kind for Microsoft Teams (a Workflows or incoming-webhook URL that takes an
    Adaptive Card), and the event of an approval's decision (``approval.decided``), which Teams
    channels take by default and other channels only when they choose it. The kind's check
    constraint is widened (dropped and added again: the old code writes only kinds it allows);
    the rest is choices, which the database does not see."""

    dependencies = [
        ("recovery", "0017_slack_app_operator_owned"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="notificationchannel", name="channel_kind_valid"),
        migrations.AlterField(
            model_name="notification",
            name="event",
            field=models.CharField(
                choices=[
                    ("approval.requested", "Approval requested"),
                    ("approval.reminder", "Approval reminder (half its window)"),
                    ("approval.escalated", "Approval escalated (nobody decided in time)"),
                    ("approval.expired", "Approval expired (timed out)"),
                    ("approval.decided", "Approval decided (approved or rejected)"),
                    ("recovery.opened", "Run in the recovery queue"),
                    ("step.failed", "Compensation step failed"),
                    ("unwind.finished", "Unwind finished"),
                    ("command.overdue", "Resume not picked up"),
                    ("notification.test", "Test notification"),
                ],
                max_length=32,
            ),
        ),
        migrations.AlterField(
            model_name="notification",
            name="kind",
            field=models.CharField(choices=KINDS, max_length=16),
        ),
        migrations.AlterField(
            model_name="notificationchannel",
            name="kind",
            field=models.CharField(choices=KINDS, max_length=16),
        ),
        migrations.AddConstraint(
            model_name="notificationchannel",
            constraint=models.CheckConstraint(
                condition=models.Q(("kind__in", ["email", "webhook", "slack", "teams"])),
                name="channel_kind_valid",
            ),
        ),
    ]
