"""The recovery queue (the ``operator`` scope): the items, one with its compensation plan and
resume preview, and the decisions on one (compensate, resume, close); flagging any run for review
opens its item by hand.

Every decision carries a required reason and is audited with the key as actor; another tenant's
object is a 404.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router, Status

from ledger.audit import Actor
from ledger.models import Checkpoint
from ledger.selectors import run_get
from recovery import selectors
from recovery.actions import compensations, resolutions
from recovery.planner import compensation_plan
from saga_admin.api.auth import AUTH_ERRORS, operator_auth
from saga_admin.api.common import WRITE_ERRORS, key_of, tenant_reach_of
from saga_admin.api.schemas.commands import CommandOut
from saga_admin.api.schemas.common import ReasonIn
from saga_admin.api.schemas.queue import (
    CompensateIn,
    ItemDetailOut,
    ItemFilters,
    ItemOut,
    ItemPageOut,
    PlanOut,
    PlanQuery,
    ResumeIn,
    ResumePreviewOut,
)
from saga_admin.api.schemas.unwinds import UnwindOut

router = Router(tags=["recovery"], auth=operator_auth)


@router.get("/recovery", response={200: ItemPageOut, **AUTH_ERRORS}, summary="The recovery queue")
def recovery_list(request: HttpRequest, filters: Query[ItemFilters]) -> ItemPageOut:
    page = selectors.items_list(
        tenants=key_of(request).tenant,
        queue_filter=filters.queue_filter(),
        cursor=filters.cursor,
        limit=filters.limit,
    )
    return ItemPageOut.from_orm(page)


@router.get(
    "/recovery/{item_id}",
    response={200: ItemDetailOut, **AUTH_ERRORS},
    summary="A recovery item with its compensation plan and resume preview",
)
def recovery_detail(request: HttpRequest, item_id: str, selection: Query[PlanQuery]) -> ItemDetailOut:
    item = selectors.item_get(reach=tenant_reach_of(request), item_id=item_id)
    plan = compensation_plan(
        run=item.run, action_ids=selection.action_ids, to_checkpoint=selection.to_checkpoint
    )
    # The item's fields, then what the detail adds.
    return ItemDetailOut(
        **dict(ItemOut.from_orm(item)),
        plan=PlanOut.model_validate(plan.as_dict()),
        resume_preview=ResumePreviewOut.model_validate(selectors.resume_preview(item=item).as_dict()),
        unwinds=[u.pk for u in selectors.unwinds_for_run(run_id=item.run_id)],
    )


@router.post(
    "/recovery/{item_id}/compensate",
    response={202: UnwindOut, **WRITE_ERRORS},
    summary="Compensate the run (LIFO unwind on the workers)",
)
def recovery_compensate(request: HttpRequest, item_id: str, body: CompensateIn) -> Status[UnwindOut]:
    key = key_of(request)
    item = selectors.item_get(reach=tenant_reach_of(request), item_id=item_id)
    unwind = compensations.unwind_start(
        item=item,
        actor=Actor.for_key(key),
        reason=body.reason,
        action_ids=body.action_ids,
        to_checkpoint=body.to_checkpoint,
        plan_hash=body.plan_hash,
    )
    return Status(202, UnwindOut.from_orm(unwind))


@router.post(
    "/recovery/{item_id}/resume",
    response={202: CommandOut, **WRITE_ERRORS},
    summary="Resume the run from a checkpoint (issues a resume command)",
)
def recovery_resume(request: HttpRequest, item_id: str, body: ResumeIn) -> Status[CommandOut]:
    key = key_of(request)
    item = selectors.item_get(reach=tenant_reach_of(request), item_id=item_id)
    checkpoint = None
    if body.checkpoint_id:
        checkpoint = tenant_reach_of(request).get(Checkpoint.objects.all(), body.checkpoint_id)
    command = resolutions.item_resume(
        item=item, actor=Actor.for_key(key), reason=body.reason, checkpoint=checkpoint
    )
    return Status(202, CommandOut.from_orm(command))


@router.post("/recovery/{item_id}/close", response={200: ItemOut, **WRITE_ERRORS}, summary="Close the item")
def recovery_close(request: HttpRequest, item_id: str, body: ReasonIn) -> Status[ItemOut]:
    key = key_of(request)
    item = selectors.item_get(reach=tenant_reach_of(request), item_id=item_id)
    resolutions.item_close(item=item, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, ItemOut.from_orm(selectors.item_get(reach=tenant_reach_of(request), item_id=item_id)))


@router.post(
    "/runs/{run_id}/flag",
    response={201: ItemOut, **WRITE_ERRORS},
    summary="Flag any run (also a succeeded one) for review: its recovery item (reason manual)",
)
def run_flag(request: HttpRequest, run_id: str, body: ReasonIn) -> Status[ItemOut]:
    key = key_of(request)
    run = run_get(reach=tenant_reach_of(request), run_id=run_id)
    item = resolutions.run_flag(run=run, actor=Actor.for_key(key), reason=body.reason)
    return Status(201, ItemOut.from_orm(selectors.item_get(reach=tenant_reach_of(request), item_id=item.pk)))
