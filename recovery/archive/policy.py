"""Each tenant's retention: its own policy set's ``audit.retention``, else the global one's
(``ledger.policies.retention``), checked again against the operator's allow-list every time it is
used (the allow-list may have changed since the file was loaded)."""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from ledger.models import PolicySet, Tenant
from ledger.policies.retention import Retention, RetentionError, configured, retention_read


def _raw_retentions() -> tuple[Any, dict[int, Any]]:
    """(the global ``retention``, {tenant id: its own}) as stored (None: not set)."""
    global_raw: Any = None
    per_tenant: dict[int, Any] = {}
    for tenant_id, audit in PolicySet.objects.filter(Q(audit__has_key="retention")).values_list(
        "tenant_id", "audit"
    ):
        if not configured(audit["retention"]):
            continue  # the earlier bare-string spelling: kept, archives nothing
        if tenant_id is None:
            global_raw = audit["retention"]
        else:
            per_tenant[tenant_id] = audit["retention"]
    return global_raw, per_tenant


def tenant_retentions(*, tenant: Tenant | None = None) -> list[tuple[Tenant, Retention | RetentionError]]:
    """Every tenant with a retention (or ``tenant`` alone, when it has one), by slug: its
    retention, or why it cannot be used."""
    global_raw, per_tenant = _raw_retentions()
    tenants = Tenant.objects.order_by("slug")
    if tenant is not None:
        tenants = tenants.filter(pk=tenant.pk)
    elif global_raw is None:
        tenants = tenants.filter(pk__in=list(per_tenant))
    found: list[tuple[Tenant, Retention | RetentionError]] = []
    for each in tenants:
        raw = per_tenant.get(each.pk, global_raw)
        if raw is None:
            continue
        try:
            found.append((each, retention_read(raw)))
        except RetentionError as exc:
            found.append((each, exc))
    return found
