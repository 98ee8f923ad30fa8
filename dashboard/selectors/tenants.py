"""The tenants a user sees (the tenant pickers of the queue, insights, policies and pauses pages)."""

from __future__ import annotations

from dashboard import permissions
from dashboard.permissions import Someone
from ledger.models import Tenant


def visible_tenants(*, user: Someone) -> list[Tenant]:
    return list(Tenant.objects.filter(pk__in=permissions.tenant_ids_for(user)).order_by("slug"))
