"""An approval's grants, one per person, for an approval that needs several people: a model of
``recovery`` (``recovery.models`` re-exports it), in a module of its own.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from ledger.models import AgentKey


class ApprovalGrant(models.Model):
    """One person's grant of an approval that needs several (``Approval.approvers_required``).
    ``approver`` identifies the person: ``user:<id>`` for a dashboard user, through their login or
    an approver key they own (``AgentKey.owner``), so the same person granting twice, through
    any of their credentials, is one grant (a unique constraint, whatever races). ``key:<name>``
    is a grant made through a key before keys had owners."""

    approval = models.ForeignKey("recovery.Approval", on_delete=models.CASCADE, related_name="grants")
    approver = models.CharField(max_length=220)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    key = models.ForeignKey(AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    label = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "approver"], name="approvalgrant_once_per_person"),
        ]

    def __str__(self) -> str:
        return f"{self.approval_id} granted by {self.label or self.approver}"
