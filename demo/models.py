"""The demo world: the "real systems" demo agents change and Saga Admin puts back.

These tables belong to pretend outside systems (an HR directory, a workspace licence service, an
email outbox, a CRM, a payments ledger). Nothing in ``ledger/`` or ``recovery/`` reads them: Saga
Admin only reaches them the way it reaches any real system, through the compensators registered
in the demo policy files (signed HTTP webhooks or Python callables). Writes go through
``demo.services``.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q


class HrUser(models.Model):
    email = models.EmailField(unique=True)
    name = models.CharField(max_length=200)
    department = models.CharField(max_length=100, blank=True, default="")
    title = models.CharField(max_length=200, blank=True, default="")
    manager = models.CharField(max_length=200, blank=True, default="")
    start_date = models.DateField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # The tenant whose agent put the row here (the seeded world is Acme's): /demo-world/ shows a
    # person only their tenants' rows.
    tenant_slug = models.SlugField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["email"]
        verbose_name = "HR user"

    def __str__(self) -> str:
        return self.email

    def snapshot(self) -> dict[str, Any]:
        return {
            "email": self.email,
            "name": self.name,
            "department": self.department,
            "title": self.title,
            "manager": self.manager,
            "start_date": self.start_date.isoformat() if self.start_date else None,
        }


class WorkspaceLicense(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        CANCELLED = "cancelled", "Cancelled"

    email = models.EmailField()
    sku = models.CharField(max_length=100)
    monthly_cost_cents = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    # The tenant whose agent put the row here (the seeded world is Acme's): /demo-world/ shows a
    # person only their tenants' rows.
    tenant_slug = models.SlugField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["email"]
        constraints = [
            # One paid seat per person: provisioning twice must not bill twice.
            models.UniqueConstraint(
                fields=["email"], condition=Q(status="active"), name="demo_one_active_license"
            ),
            models.CheckConstraint(
                condition=Q(status__in=["active", "cancelled"]), name="demo_license_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sku} for {self.email} ({self.status})"

    def snapshot(self) -> dict[str, Any]:
        return {"license_id": self.pk, "email": self.email, "sku": self.sku, "status": self.status}


class OutboxEmail(models.Model):
    class Kind(models.TextChoices):
        DRAFT = "draft", "Draft"
        SENT = "sent", "Sent"
        DISCARDED = "discarded", "Discarded draft"

    to = models.EmailField()
    subject = models.CharField(max_length=300)
    body = models.TextField()
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SENT)
    # A correction points at the message it corrects: one correction per message.
    corrects = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="correction"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    # The tenant whose agent put the row here (the seeded world is Acme's): /demo-world/ shows a
    # person only their tenants' rows.
    tenant_slug = models.SlugField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=["draft", "sent", "discarded"]), name="demo_email_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject} → {self.to}"

    def snapshot(self) -> dict[str, Any]:
        return {"message_id": self.pk, "to": self.to, "subject": self.subject, "kind": self.kind}


class CrmContact(models.Model):
    id = models.CharField(primary_key=True, max_length=32)
    name = models.CharField(max_length=200)
    email = models.EmailField()
    company = models.CharField(max_length=200)
    tier = models.CharField(max_length=32, default="standard")
    owner = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    # The tenant whose agent put the row here (the seeded world is Acme's): /demo-world/ shows a
    # person only their tenants' rows.
    tenant_slug = models.SlugField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["id"]
        verbose_name = "CRM contact"

    def __str__(self) -> str:
        return f"{self.id} {self.name}"

    def snapshot(self) -> dict[str, Any]:
        return {
            "contact_id": self.id,
            "name": self.name,
            "email": self.email,
            "company": self.company,
            "tier": self.tier,
            "owner": self.owner,
        }


class CrmTicket(models.Model):
    id = models.CharField(primary_key=True, max_length=32)
    subject = models.CharField(max_length=300)
    company = models.CharField(max_length=200)
    contact = models.ForeignKey(
        CrmContact, null=True, blank=True, on_delete=models.SET_NULL, related_name="tickets"
    )
    priority = models.CharField(max_length=16, default="normal")
    status = models.CharField(max_length=32, default="open")
    assignee = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)
    # Who touched it last: an agent, or a person working in the CRM directly.
    updated_by = models.CharField(max_length=200, blank=True, default="")

    # The tenant whose agent put the row here (the seeded world is Acme's): /demo-world/ shows a
    # person only their tenants' rows.
    tenant_slug = models.SlugField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["id"]
        verbose_name = "CRM ticket"

    def __str__(self) -> str:
        return f"{self.id} {self.subject}"

    # The fields an agent may change and a restore may put back.
    EDITABLE = ("priority", "status", "assignee")

    def snapshot(self) -> dict[str, Any]:
        return {
            "ticket_id": self.id,
            "company": self.company,
            "subject": self.subject,
            "priority": self.priority,
            "status": self.status,
            "assignee": self.assignee,
        }


class Payment(models.Model):
    class Status(models.TextChoices):
        CAPTURED = "captured", "Captured"
        PARTIALLY_REFUNDED = "partially_refunded", "Partially refunded"
        REFUNDED = "refunded", "Refunded"

    id = models.CharField(primary_key=True, max_length=32)
    customer = models.CharField(max_length=200)
    amount_cents = models.PositiveIntegerField()
    currency = models.CharField(max_length=3, default="USD")
    description = models.CharField(max_length=300, blank=True, default="")
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.CAPTURED)
    refunded_cents = models.PositiveIntegerField(default=0)
    # A customer's chargeback freezes the payment: the processor refuses refunds until it resolves.
    disputed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    # The tenant whose agent put the row here (the seeded world is Acme's): /demo-world/ shows a
    # person only their tenants' rows.
    tenant_slug = models.SlugField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-created_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(refunded_cents__lte=models.F("amount_cents")),
                name="demo_payment_refund_within_amount",
            ),
            models.CheckConstraint(
                condition=Q(status__in=["captured", "partially_refunded", "refunded"]),
                name="demo_payment_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.amount_cents / 100:.2f} {self.currency}"

    def snapshot(self) -> dict[str, Any]:
        return {
            "payment_id": self.id,
            "customer": self.customer,
            "amount_cents": self.amount_cents,
            "currency": self.currency,
            "status": self.status,
            "refunded_cents": self.refunded_cents,
        }


class Refund(models.Model):
    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="refunds")
    amount_cents = models.PositiveIntegerField()
    reason = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"refund {self.amount_cents / 100:.2f} of {self.payment_id}"


class WorldRequest(models.Model):
    """A stored response per Idempotency-Key: a repeated call (a retry, a re-enqueued step) gets
    the first answer back and changes nothing, as the webhook protocol asks of receivers."""

    key = models.CharField(max_length=255, unique=True)
    operation = models.CharField(max_length=100)
    request_hash = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    body = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.operation} {self.key} → {self.status_code}"


class AgentCredential(models.Model):
    """The demo agents' harness configuration: which API key each demo agent uses.

    Saga Admin shows a key once and keeps only its hash; like any harness, the demo agents keep
    their own copy (here, in the demo world's database) so that ``seed_demo`` run twice reuses
    the keys instead of minting new ones.
    """

    tenant_slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    key_id = models.CharField(max_length=40)
    secret = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_slug", "name"], name="demo_one_credential_per_agent")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_slug}/{self.name}"
