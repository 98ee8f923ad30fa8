"""A tenant's Slack app and which Slack users are which of its dashboard users (one-time link
codes): models of the ``recovery`` app, kept apart from ``recovery.models`` (which imports them)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from ledger.models import Tenant


class SlackApp(models.Model):
    """A tenant's Slack app: its signing secret verifies Slack's requests; approval messages then
    carry buttons. ``operator_owned``: the installation's app (``SAGA_SLACK_SIGNING_SECRET``), where
    a press decides; otherwise a press only asks (``recovery.actions.channels.slack_press_decides``)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="slack_app")
    signing_secret = models.CharField(max_length=200, blank=True)
    operator_owned = models.BooleanField(default=False, db_default=False)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"Slack app of {self.tenant_id}"


class SlackUserLink(models.Model):
    """A Slack user (workspace team id + user id) who is a dashboard user of the tenant: whose
    button presses count as that user's decisions. Made only by that user (``SlackLinkCode``);
    ``confirmed_at`` is when they did. A link without it was typed in by an admin before links
    became self-service: it is listed so an admin can remove it, and counts for nothing."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="slack_user_links")
    team_id = models.CharField(max_length=32)
    slack_user_id = models.CharField(max_length=32)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "team_id", "slack_user_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "team_id", "slack_user_id"], name="slack_user_once_per_tenant"
            ),
        ]

    def __str__(self) -> str:
        return f"Slack link of user {self.user_id}"  # tenant admins see who, not which Slack user


class SlackLinkCode(models.Model):
    """A one-time code the dashboard showed a signed-in user so they can link their Slack account:
    sent back from Slack in a signed command, it links the Slack user who sent it to this user, in
    this tenant. Stored as a SHA-256 of the code (which is random: 80 bits), never the code; one
    per user and tenant (asking again replaces it); deleted when used."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    code_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="slack_link_code_once_per_user"),
        ]

    def __str__(self) -> str:
        return f"Slack link code of {self.user_id} in {self.tenant_id}"
