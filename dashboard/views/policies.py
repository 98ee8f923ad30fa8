"""The policies page: each visible tenant's tool policies, compensators and warnings."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard.permissions import Capability, can
from dashboard.selectors import policies as policy_selectors
from dashboard.selectors import tenants as tenant_selectors
from dashboard.views.common import HtmxHttpRequest


@require_GET
@login_required
def policies(request: HtmxHttpRequest) -> HttpResponse:
    tenants = tenant_selectors.visible_tenants(user=request.user)
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
        },
    )
