from django.db import migrations, models

_KINDS = [
    ("email", "E-mail"),
    ("webhook", "Signed webhook"),
    ("slack", "Slack incoming webhook"),
    ("pagerduty", "PagerDuty (Events API v2)"),
]


class Migration(migrations.Migration):
    """PagerDuty channels (Events API v2): a fourth channel kind, whose target may be blank (the
    installation's endpoint) and whose secret is the routing key; and the events that acknowledge
    or resolve what a PagerDuty channel paged about. Choices only, besides the kind's check
    constraint, which the previous release's code (three kinds) satisfies."""

    dependencies = [
        ("recovery", "0017_slack_app_operator_owned"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="notificationchannel", name="channel_kind_valid"),
        migrations.AddConstraint(
            model_name="notificationchannel",
            constraint=models.CheckConstraint(
                condition=models.Q(kind__in=["email", "webhook", "slack", "pagerduty"]),
                name="channel_kind_valid",
            ),
        ),
        migrations.AlterField(
            model_name="notificationchannel",
            name="kind",
            field=models.CharField(choices=_KINDS, max_length=16),
        ),
        migrations.AlterField(
            model_name="notificationchannel",
            name="target",
            field=models.CharField(blank=True, max_length=2000),
        ),
        migrations.AlterField(
            model_name="notification",
            name="kind",
            field=models.CharField(choices=_KINDS, max_length=16),
        ),
        migrations.AlterField(
            model_name="notification",
            name="event",
            field=models.CharField(
                choices=[
                    ("approval.requested", "Approval requested"),
                    ("approval.reminder", "Approval reminder (half its window)"),
                    ("approval.escalated", "Approval escalated (nobody decided in time)"),
                    ("approval.expired", "Approval expired (timed out)"),
                    ("recovery.opened", "Run in the recovery queue"),
                    ("step.failed", "Compensation step failed"),
                    ("unwind.finished", "Unwind finished"),
                    ("command.overdue", "Resume not picked up"),
                    ("notification.test", "Test notification"),
                    ("approval.granted", "Approval granted by one of several approvers"),
                    ("approval.decided", "Approval decided (approved, rejected or withdrawn)"),
                    ("recovery.claimed", "Recovery item taken up (an unwind started)"),
                    ("recovery.resolved", "Recovery item resolved"),
                ],
                max_length=32,
            ),
        ),
    ]
