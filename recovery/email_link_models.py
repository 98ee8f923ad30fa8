"""The e-mail decision links that were used (``recovery.notifications.email_links``): a model of
the ``recovery`` app, kept apart from ``recovery.models`` (which imports it)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class EmailLinkUse(models.Model):
    """An e-mail decision link that was used: its nonce, recorded in the transaction of the
    decision it made (or the refusal it met), so a link decides at most once — of two uses
    racing, the second waits on the first's row and then finds it taken. A link never used has no
    row: it is signed, not stored, and expires by itself."""

    nonce = models.CharField(primary_key=True, max_length=64)
    approval = models.ForeignKey("recovery.Approval", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    decision = models.CharField(max_length=8)
    used_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "recovery"

    def __str__(self) -> str:
        return f"E-mail link {self.decision} of {self.approval_id}, used"
