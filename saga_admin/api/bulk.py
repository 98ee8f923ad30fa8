"""Bulk decisions by filter (the ``operator`` scope): preview what a filter matches, start one
decision over all of it, follow its progress, abort it. The decisions are
``recovery.actions.bulk_filter``'s; another tenant's bulk is a 404."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Status

from infra import errors
from recovery import selectors
from recovery.actions import bulk_filter
from saga_admin.api.auth import AUTH_ERRORS, operator_auth
from saga_admin.api.common import WRITE_ERRORS, actor_of, check_id, key_of, tenant_reach_of
from saga_admin.api.schemas.bulk import BulkIn, BulkOut, BulkPreviewOut, BulkStartOut
from saga_admin.api.schemas.common import ReasonIn

router = Router(tags=["recovery"], auth=operator_auth)


@router.post(
    "/recovery/bulk",
    response={200: BulkPreviewOut, 202: BulkStartOut, **WRITE_ERRORS},
    summary="Preview, or start, one decision over every item a filter matches",
)
def bulk_create(request: HttpRequest, body: BulkIn) -> Status[BulkPreviewOut] | Status[BulkStartOut]:
    tenant = key_of(request).tenant
    queue_filter = body.filter.queue_filter()
    if body.preview:
        preview = bulk_filter.bulk_preview(tenant=tenant, queue_filter=queue_filter, action=body.action)
        return Status(200, BulkPreviewOut.from_orm(preview))
    if body.expected_count is None:
        raise errors.ValidationFailed(
            "expected_count is required to start a bulk: the count the preview showed.",
            details={"expected_count": "required"},
        )
    bulk = bulk_filter.bulk_start(
        tenant=tenant,
        queue_filter=queue_filter,
        action=body.action,
        reason=body.reason,
        actor=actor_of(request),
        expected_count=body.expected_count,
    )
    return Status(202, BulkStartOut.from_orm(bulk))


@router.get(
    "/recovery/bulk/{bulk_id}",
    response={200: BulkOut, **AUTH_ERRORS},
    summary="A bulk decision and its progress (poll it)",
)
def bulk_detail(request: HttpRequest, bulk_id: str) -> BulkOut:
    check_id("BulkOperation", bulk_id)
    return BulkOut.from_orm(selectors.bulk_get(reach=tenant_reach_of(request), bulk_id=bulk_id))


@router.post(
    "/recovery/bulk/{bulk_id}/abort",
    response={200: BulkOut, **WRITE_ERRORS},
    summary="Abort a bulk decision: no further item starts; decisions made stand",
)
def bulk_abort(request: HttpRequest, bulk_id: str, body: ReasonIn) -> BulkOut:
    check_id("BulkOperation", bulk_id)
    bulk = selectors.bulk_get(reach=tenant_reach_of(request), bulk_id=bulk_id)
    return BulkOut.from_orm(bulk_filter.bulk_abort(bulk=bulk, actor=actor_of(request), reason=body.reason))
