"""The tool policies in force for the caller's tenant (with its defaults for unwinds and
automatic compensation)."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils.cache import patch_vary_headers
from ninja import Router

from ledger.models import PolicyStamp
from ledger.policies.deadlines import approval_timeout_text, default_policy_shown
from ledger.policies.resolve import policies_in_force, policy_settings_for
from saga_admin.api.auth import AUTH_ERRORS, agent_auth, reader_auth
from saga_admin.api.common import tenant_of
from saga_admin.api.schemas.policies import PoliciesOut

# Writes as an agent unless an operation says ``auth=reader_auth`` (saga_admin.api.common).
router = Router(tags=["agents"], auth=agent_auth)


@router.get(
    "/policies",
    response={200: PoliciesOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="The tool policies in force",
    description="Answers with an `ETag` that moves whenever any policy, compensator or reader is "
    "loaded; send it back as `If-None-Match` and an unchanged answer is 304 with no body (what the "
    "clients do to keep their copy current).",
)
def policy_list(request: HttpRequest, response: HttpResponse) -> dict[str, Any] | HttpResponse:
    tenant = tenant_of(request)
    # The policy stamp moves with every write to the tables it covers (ledger.policy_models), so
    # the same stamp means the same answer for this tenant.
    stamp = PolicyStamp.objects.filter(pk=1).values_list("version", flat=True).first() or 0
    etag = f'"policies-{tenant.pk}-{stamp}"'
    if etag in [tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")]:
        not_modified = HttpResponse(status=304)
        not_modified["ETag"] = etag
        return not_modified
    response["ETag"] = etag
    patch_vary_headers(response, ["Authorization"])
    settings_ = policy_settings_for(tenant)
    return {
        "policies": [
            {
                "tool": p.tool,
                "risk": p.risk,
                "approval": p.approval,
                "action_class": p.action_class,
                "compensation": p.compensation,
                "compensation_tool": p.compensation_tool,
                "compensation_args": p.compensation_args,
                "approvers": p.approvers,
                "approval_timeout": approval_timeout_text(p.approval_timeout_s),
                "on_timeout": p.on_timeout,
                "escalate_to": p.escalate_to or None,
                "rules": p.rules,
                "limits": p.limits,
                "before": p.before,
                "scope": "tenant" if p.tenant_id else "global",
                "source": p.source,
            }
            for p in policies_in_force(tenant=tenant)
        ],
        "default_policy": default_policy_shown(settings_.default_policy),
        "unwind": settings_.unwind,
        "auto_compensate": settings_.auto_compensate,
        "source": settings_.source,
    }
