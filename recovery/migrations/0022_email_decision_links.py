import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    """The nonces of e-mail decision links that were used (recovery.notifications.email_links): one row each,
    its primary key the nonce, so a link decides at most once."""

    dependencies = [
        ("recovery", "0021_notification_channel_status"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="EmailLinkUse",
            fields=[
                ("nonce", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("decision", models.CharField(max_length=8)),
                ("used_at", models.DateTimeField(auto_now_add=True)),
                (
                    "approval",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="recovery.approval"
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
    ]
