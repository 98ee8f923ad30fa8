"""Keyed audit chain heads (``ledger.audit_signing``): the signed heads, append-only like the
events they vouch for, and each tenant's signing cursor; and the runs retention archived (their
tombstones). Re-exported by ``ledger.models``."""

from __future__ import annotations

from django.db import models

from ledger.append_only import append_only_triggers


class SignedHead(models.Model):
    """One chain's head at one moment, signed (HMAC-SHA256 under ``SAGA_AUDIT_KEY``, a key kept
    outside the database): the chain ``chain`` had ``position`` events, the last of them hashing
    to ``head`` (event ``event_id``), when it was signed at ``signed_at``. The hash of an event
    covers every event before it in its chain, so a signed head vouches for the whole prefix.
    Append-only: the database refuses UPDATE, DELETE and TRUNCATE, as for events."""

    class Reason(models.TextChoices):
        INTERVAL = "interval", "Interval"
        ARCHIVE = "archive", "Archive"

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.PROTECT, related_name="+")
    chain = models.CharField(max_length=64)
    position = models.BigIntegerField()
    # Not a foreign key: the events an archive removes leave their signed heads behind.
    event_id = models.BigIntegerField()
    head = models.CharField(max_length=64)
    signed_at = models.DateTimeField()
    key_id = models.CharField(max_length=16)  # which key signed it (a fingerprint, not the key)
    reason = models.CharField(max_length=16, choices=Reason.choices, default=Reason.INTERVAL)
    signature = models.CharField(max_length=64)

    class Meta:
        constraints = [
            # Two signers signing the same chain at the same length: one row (the second does nothing).
            models.UniqueConstraint(fields=["chain", "position"], name="signed_head_chain_position"),
        ]
        indexes = [models.Index(fields=["event_id"], name="signed_head_event")]
        triggers = append_only_triggers("signed_head", what="Signed audit heads are")

    def __str__(self) -> str:
        return f"{self.chain} at {self.position}"


class AuditSignCursor(models.Model):
    """Up to which snapshot a tenant's chains are signed (``ledger.audit_signing.audit_heads_sign``):
    the next pass signs the chains that transactions committed after it wrote to, as of its own
    snapshot (``batch_snapshot``), a few hundred chains a transaction in chain order
    (``batch_after_chain``: the last one done)."""

    tenant = models.OneToOneField(
        "ledger.Tenant", on_delete=models.CASCADE, primary_key=True, related_name="+"
    )
    done_snapshot = models.TextField(blank=True, default="")
    batch_snapshot = models.TextField(blank=True, default="")
    batch_after_chain = models.CharField(max_length=64, blank=True, default="")
    signed_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"signing cursor of tenant {self.tenant_id}"


class ArchivedRun(models.Model):
    """A run that retention moved out of PostgreSQL (``recovery.archive``): where its archive is,
    and what it held, so that ``GET`` of it answers 410 ``archived`` and ``verify_audit`` can tell
    a chain that was archived from one that was deleted. Written in the transaction that removes
    the run, next to the tenant-chain event that records it. Append-only, like the events."""

    run_id = models.CharField(primary_key=True, max_length=40)
    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.PROTECT, related_name="+")
    agent = models.CharField(max_length=200)
    owner = models.CharField(
        max_length=200, blank=True, default=""
    )  # the run's: an agent key reaches its own
    status = models.CharField(max_length=16)  # the run's status when it was archived
    created_at = models.DateTimeField()  # the run's
    finished_at = models.DateTimeField()  # the run's: retention counts from here
    archived_at = models.DateTimeField()
    archive = models.TextField()  # the URL of the run's manifest
    manifest_sha256 = models.CharField(max_length=64)
    head = models.CharField(max_length=64)  # the run chain's last hash when it was archived
    events = models.BigIntegerField()  # the run chain's length when it was archived

    class Meta:
        indexes = [models.Index(fields=["tenant", "-archived_at"], name="archived_run_tenant")]
        triggers = append_only_triggers("archived_run", what="Archived runs are")

    def __str__(self) -> str:
        return f"{self.run_id} (archived)"
