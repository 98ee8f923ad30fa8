"""The policies page: each visible tenant's tool policies, compensators and warnings."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from dashboard.permissions import Capability, can, require_tenant, tenants_for
from dashboard.selectors import policies as policy_selectors
from dashboard.views.common import HtmxHttpRequest, actor, done
from recovery import compensator_checks


@require_GET
@login_required
def policies(request: HtmxHttpRequest) -> HttpResponse:
    tenants = tenants_for(request.user)
    return render(
        request,
        "dashboard/policies.html",
        {
            # Where a compensator points (its URL or Python path) is for those who operate the
            # tenant: operators and admins, not viewers or approvers.
            "sections": [
                policy_selectors.policies_for(
                    tenant=tenant,
                    show_targets=can(request.user, Capability.OPERATE, tenant.pk),
                )
                for tenant in tenants
            ],
            # Who may check a compensator (only harmless calls, but calls all the same): admins.
            "can_check": {
                tenant.pk for tenant in tenants if can(request.user, Capability.ADMINISTER, tenant.pk)
            },
        },
    )


@require_POST
@login_required
def compensator_check(request: HtmxHttpRequest, tenant_id: int, compensator_id: int) -> HttpResponse:
    """Check a compensator the tenant's policies page lists, with the protocol's harmless cases
    only (recovery.compensator_checks): admins of the tenant. Another tenant's compensator, or one
    the tenant overrides, is 404 as a tenant that is not the reader's is."""
    tenant = require_tenant(request.user, Capability.ADMINISTER, pk=tenant_id)
    row = compensator_checks.compensator_in_force(tenant=tenant, compensator_id=compensator_id)
    if row is None:
        raise Http404("No such compensator.")
    check = compensator_checks.compensator_check(
        tenant=tenant, actor=actor(request), user=request.user, row=row
    )
    if check.ok:
        messages.success(request, f"{row.tool}: its compensator passed the harmless checks.")
    else:
        messages.error(request, f"{row.tool}: {compensator_checks.check_flag(check)}")
    return done(request, reverse("dashboard:policies") + f"#compensator-{tenant.pk}-{row.pk}")
