"""Which sinks the audit stream goes to, and the key that signs its chain heads.

The installation's sinks come from the environment (``settings.AUDIT_STREAM``: trusted, as the
operator's own configuration); a tenant's from its ``AuditSink`` rows, whose URL is hostile and goes
through ``infra.outbound.check_url`` when saved and again before every send. The key
(``SAGA_AUDIT_KEY`` or ``SAGA_AUDIT_KEY_FILE``) lives outside the database, so whoever can write
the database cannot forge a chain head; it is required only when some sink is configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from infra import errors, outbound
from ledger.audit import Actor, audit_record
from ledger.models import Tenant
from recovery.audit_stream.models import AuditCursor, AuditSink, shown_url

SYSLOG_SCHEMES = {"tcp": 0, "tcp+tls": 0}
HEC_SCHEMES = outbound.HTTP_SCHEMES
URL_MAX = 500
TOKEN_MAX = 200


class AuditStreamNotConfigured(ImproperlyConfigured):
    """A sink is configured but cannot be started (no key, a malformed installation URL)."""


@dataclass(frozen=True)
class Sink:
    """One destination. ``name`` keys its cursors: ``syslog``, ``hec`` or ``tenant:<sink id>``."""

    name: str
    kind: str  # AuditSink.Kind
    url: str
    token: str = ""
    ca_file: str = ""
    verify: bool = True
    tenant_id: int | None = None  # a tenant's own sink: its events only, its URL hostile

    @property
    def hostile(self) -> bool:
        return self.tenant_id is not None

    @property
    def tls(self) -> bool:
        # The check's own parse (scheme in any case), never a second reading of the text.
        return outbound.url_scheme(self.url) in outbound.TLS_SCHEMES


def options() -> dict[str, Any]:
    raw: dict[str, Any] = getattr(settings, "AUDIT_STREAM", {})
    return raw


def installation_sinks() -> list[Sink]:
    raw = options()
    sinks = []
    if raw.get("SYSLOG_URL"):
        sinks.append(
            Sink(
                name="syslog",
                kind=AuditSink.Kind.SYSLOG,
                url=str(raw["SYSLOG_URL"]),
                ca_file=str(raw.get("SYSLOG_CA_FILE", "")),
                verify=bool(raw.get("SYSLOG_TLS_VERIFY", True)),
            )
        )
    if raw.get("HEC_URL"):
        sinks.append(
            Sink(
                name="hec",
                kind=AuditSink.Kind.HEC,
                url=str(raw["HEC_URL"]),
                token=str(raw.get("HEC_TOKEN", "")),
                ca_file=str(raw.get("HEC_CA_FILE", "")),
                verify=bool(raw.get("HEC_TLS_VERIFY", True)),
            )
        )
    return sinks


def tenant_sink(row: AuditSink) -> Sink:
    return Sink(name=f"tenant:{row.pk}", kind=row.kind, url=row.url, token=row.token, tenant_id=row.tenant_id)


def still_configured(sink: Sink) -> bool:
    """Whether a tenant's sink is still as this pass read it (enabled, the same URL): a sink removed
    or pointed elsewhere meanwhile must get nothing more (its cursor would start from the first
    event, to an address nobody wants it at). The installation's sinks are the settings'."""
    if sink.tenant_id is None:
        return True
    row_id = sink.name.removeprefix("tenant:")
    return AuditSink.objects.filter(pk=int(row_id), enabled=True, url=sink.url).exists()


def all_sinks() -> list[Sink]:
    rows = AuditSink.objects.filter(enabled=True).order_by("pk")
    return installation_sinks() + [tenant_sink(row) for row in rows]


def audit_key() -> bytes:
    """The chain heads' HMAC key; ``AuditStreamNotConfigured`` naming the variables when unset."""
    key = str(options().get("KEY", ""))
    if not key:
        raise AuditStreamNotConfigured(
            "The audit stream has a sink configured but no signing key: set SAGA_AUDIT_KEY (or "
            "SAGA_AUDIT_KEY_FILE, a file holding it; kept outside the database) to a long random "
            "secret, e.g. `openssl rand -hex 32`. Nothing is sent until it is set."
        )
    return key.encode()


def check_installation() -> list[str]:
    """What is wrong with the installation's audit stream settings (empty: nothing)."""
    problems = []
    sinks = installation_sinks()
    for sink in sinks:
        schemes = SYSLOG_SCHEMES if sink.kind == AuditSink.Kind.SYSLOG else HEC_SCHEMES
        variable = "SAGA_AUDIT_SYSLOG_URL" if sink.kind == AuditSink.Kind.SYSLOG else "SAGA_AUDIT_HEC_URL"
        problem = url_problem(sink.url, schemes)
        if problem:
            problems.append(f"{variable}: {problem}")
    if any(s.kind == AuditSink.Kind.HEC for s in sinks) and not options().get("HEC_TOKEN"):
        problems.append(
            "SAGA_AUDIT_HEC_URL is set without SAGA_AUDIT_HEC_TOKEN (or SAGA_AUDIT_HEC_TOKEN_FILE)."
        )
    if sinks and not options().get("KEY"):
        try:
            audit_key()
        except AuditStreamNotConfigured as exc:
            problems.append(str(exc))
    return problems


def url_problem(url: str, schemes: dict[str, int] | Any) -> str:
    """A URL's shape checked (scheme, host, port), not where it points."""
    _, sep, rest = url.partition("://")
    host_port = rest.split("/", 1)[0].rpartition("@")[2]
    host, _, port = host_port.rpartition(":")
    if not sep or outbound.url_scheme(url) not in schemes:
        return f"must be a {' or '.join(f'{s}://' for s in schemes)} URL"
    if not (host or host_port):
        return "has no host"
    if schemes is SYSLOG_SCHEMES and not port.isdigit():
        return "needs a port (tcp://host:port)"
    return ""


def check_tenant_sink(
    *, kind: str, url: str, token: str, tenant_id: int | None = None
) -> outbound.CheckedUrl:
    """A tenant's sink as asked for: the kind known, the URL's size, scheme, and where it points
    (``infra.outbound``: public addresses, or hosts the operator allows), the token's size.
    Raises ``errors.ValidationFailed`` or ``errors.UrlNotAllowed`` (422), naming the field. The name
    resolves in the tenant's share of the resolver (``tenant_id``; the installation's without)."""
    if kind not in AuditSink.Kind.values:
        raise errors.ValidationFailed(
            f"kind must be one of {', '.join(AuditSink.Kind.values)}.", details={"field": "kind"}
        )
    if len(url) > URL_MAX:
        raise errors.ValidationFailed(f"url is longer than {URL_MAX} characters.", details={"field": "url"})
    if len(token) > TOKEN_MAX:
        raise errors.ValidationFailed(
            f"token is longer than {TOKEN_MAX} characters.", details={"field": "token"}
        )
    if kind == AuditSink.Kind.HEC and not token:
        raise errors.ValidationFailed("An HTTPS JSON (HEC) sink needs its token.", details={"field": "token"})
    schemes = SYSLOG_SCHEMES if kind == AuditSink.Kind.SYSLOG else HEC_SCHEMES
    # The audit log (and an HEC sink's token) never crosses the network in clear text.
    owner = outbound.owner_of(tenant_id) if tenant_id is not None else ""
    return outbound.check_url(url, field="url", schemes=schemes, tls=True, owner=owner)


def tenants_for(sink: Sink) -> list[Tenant]:
    if sink.tenant_id is not None:
        return list(Tenant.objects.filter(pk=sink.tenant_id))
    return list(Tenant.objects.order_by("pk"))


def sink_set(*, tenant: Tenant, actor: Actor, kind: str, url: str, token: str, enabled: bool) -> AuditSink:
    """A tenant admin sets the tenant's sink of ``kind`` (created or replaced); checked as hostile
    (``check_tenant_sink``) and audited. A blank token keeps the current one. Refusals change
    nothing. Its cursor starts from the tenant's first event when it is new or its URL changed."""
    with transaction.atomic():
        # The tenant's row first: two first saves at once would both find no sink and the second
        # create would break the one-sink-per-kind constraint; this way the second updates.
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        current = AuditSink.objects.select_for_update().filter(tenant=tenant, kind=kind).first()
        token = token or (current.token if current is not None else "")
        check_tenant_sink(kind=kind, url=url, token=token, tenant_id=tenant.pk)
        if current is None:
            current = AuditSink.objects.create(
                tenant=tenant, kind=kind, url=url, token=token, enabled=enabled
            )
        else:
            if current.url != url:
                AuditCursor.objects.filter(sink=tenant_sink(current).name).delete()
            current.url, current.token, current.enabled = url, token, enabled
            current.save(update_fields=["url", "token", "enabled"])
        audit_record(
            tenant=tenant,
            actor=actor,
            kind="audit_stream.sink_set",
            subject=f"audit_sink:{current.pk}",
            data={"kind": kind, "url": shown_url(url), "enabled": enabled},
        )
    return current


def sink_remove(*, tenant: Tenant, actor: Actor, kind: str) -> bool:
    with transaction.atomic():
        current = AuditSink.objects.select_for_update().filter(tenant=tenant, kind=kind).first()
        if current is None:
            return False
        AuditCursor.objects.filter(sink=tenant_sink(current).name).delete()
        audit_record(
            tenant=tenant,
            actor=actor,
            kind="audit_stream.sink_removed",
            subject=f"audit_sink:{current.pk}",
            data={"kind": kind, "url": shown_url(current.url)},
        )
        current.delete()
    return True
