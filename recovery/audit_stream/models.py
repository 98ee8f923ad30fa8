"""The audit stream's own tables (``recovery.audit_stream``, its own app: ``audit_stream``): a
tenant's sinks, and each sink's cursor per tenant."""

from __future__ import annotations

from django.db import models

from ledger.models import Tenant


def shown_url(url: str) -> str:
    """A URL without credentials (``user:password@``): how a sink's URL is shown and audited."""
    scheme, sep, rest = url.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme}{sep}{host.rpartition('@')[2]}{slash}{path}"


class AuditSink(models.Model):
    """A tenant's own sink: its URL hostile (``config.check_tenant_sink``), its token never shown."""

    class Kind(models.TextChoices):
        SYSLOG = "syslog", "Syslog (RFC 5424 over TCP)"
        HEC = "hec", "HTTPS JSON (Splunk HEC)"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="audit_sinks")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.CharField(max_length=500)
    token = models.CharField(max_length=200, blank=True, default="")
    enabled = models.BooleanField(default=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "kind"], name="audit_sink_kind_per_tenant")]

    def __str__(self) -> str:
        return f"{self.kind} {self.shown_url}"

    @property
    def shown_url(self) -> str:
        return shown_url(self.url)


class AuditCursor(models.Model):
    """How far one sink has one tenant's audit stream (``recovery.audit_stream.delivery``)."""

    sink = models.CharField(max_length=40)  # syslog, hec (the installation's) or tenant:<AuditSink id>
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    done_snapshot = models.TextField(blank=True, default="")
    batch_snapshot = models.TextField(blank=True, default="")
    batch_after_id = models.BigIntegerField(default=0)
    position = models.BigIntegerField(default=0)
    stream_head = models.CharField(max_length=64, default="0" * 64)
    head_signed_at = models.DateTimeField(null=True, blank=True)
    failures = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["sink", "tenant"], name="audit_cursor_per_sink")]

    def __str__(self) -> str:
        return f"{self.sink} {self.tenant_id} at {self.position}"
