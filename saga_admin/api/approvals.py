"""Approvals: the inbox and the decisions (the ``approver`` scope), and asking again for an
expired or rejected one.

Only approver keys decide (an operator key does not: an automation holding one key would approve
its own requests), and never what their own agent or automation asked for (403 self_approval,
recovery.transitions.approvals.is_requester).

Every decision carries a required reason and is audited with the key as actor; another tenant's
object is a 404.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router, Status

from ledger.audit import Actor
from recovery import selectors
from recovery.actions import approvals
from recovery.models import Approval
from saga_admin.api.auth import AUTH_ERRORS, approver_auth, operator_auth, reader_auth
from saga_admin.api.common import WRITE_ERRORS, key_of, reach_of, tenant_reach_of
from saga_admin.api.schemas.approvals import (
    ApprovalFilters,
    ApprovalOut,
    ApprovalPageOut,
    ApproveIn,
)
from saga_admin.api.schemas.common import ReasonIn

router = Router(tags=["recovery"], auth=operator_auth)


@router.get(
    "/approvals",
    response={200: ApprovalPageOut, **AUTH_ERRORS},
    auth=approver_auth,
    summary="The approval inbox (approver scope)",
)
def approvals_list(request: HttpRequest, filters: Query[ApprovalFilters]) -> ApprovalPageOut:
    page = selectors.approvals_list(
        tenants=key_of(request).tenant,
        status=filters.status,
        kind=filters.kind,
        cursor=filters.cursor,
        limit=filters.limit,
    )
    return ApprovalPageOut.from_orm(page)


@router.post(
    "/approvals/{approval_id}/approve",
    response={200: ApprovalOut, **WRITE_ERRORS},
    auth=approver_auth,
    summary="Approve (optionally with edited args; approver scope, never your own request)",
)
def approval_approve(request: HttpRequest, approval_id: str, body: ApproveIn) -> Status[ApprovalOut]:
    key = key_of(request)
    approval = selectors.approval_get(reach=tenant_reach_of(request), approval_id=approval_id)
    decided = approvals.approval_approve(
        approval=approval,
        actor=Actor.for_key(key),
        reason=body.reason,
        args=body.args,
        shown_args_hash=body.args_hash,
    )
    return Status(200, ApprovalOut.from_orm(decided))


@router.post(
    "/approvals/{approval_id}/reject",
    response={200: ApprovalOut, **WRITE_ERRORS},
    auth=approver_auth,
    summary="Reject with a reason (approver scope)",
)
def approval_reject(request: HttpRequest, approval_id: str, body: ReasonIn) -> Status[ApprovalOut]:
    key = key_of(request)
    approval = selectors.approval_get(reach=tenant_reach_of(request), approval_id=approval_id)
    decided = approvals.approval_reject(approval=approval, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, ApprovalOut.from_orm(decided))


@router.post(
    "/approvals/{approval_id}/request-again",
    response={201: ApprovalOut, **WRITE_ERRORS},
    auth=reader_auth,
    summary="Ask again for an expired or rejected approval (the owning agent for its action; an operator for a step)",
)
def approval_request_again(request: HttpRequest, approval_id: str, body: ReasonIn) -> Status[ApprovalOut]:
    key = key_of(request)
    # An agent key reaches only its own runs' approvals (another agent's is a 404, like another
    # tenant's); who may ask again for which kind is the service's rule.
    approval = reach_of(request).get(
        Approval.objects.select_related("run__tenant", "action", "step"),
        approval_id,
        owner_field="run__owner",
    )
    asked = approvals.approval_request_again(approval=approval, actor=Actor.for_key(key), reason=body.reason)
    return Status(201, ApprovalOut.from_orm(asked))
