"""Pauses, the kill switches (the ``operator`` scope): pausing an agent and/or a tool, listing the
pauses, lifting one.

While a pause is active, new runs of a matching agent and new actions it covers are refused with
409 ``paused`` (ledger.services.pauses); pausing and lifting are audited with the key as actor.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router, Status

from ledger.audit import Actor
from ledger.services import pauses as ledger_pauses
from saga_admin.api.auth import AUTH_ERRORS, operator_auth
from saga_admin.api.common import WRITE_ERRORS, key_of, tenant_reach_of
from saga_admin.api.schemas.common import ReasonIn
from saga_admin.api.schemas.pauses import PauseFilters, PauseIn, PauseOut, PausePageOut

router = Router(tags=["recovery"], auth=operator_auth)


@router.post(
    "/pauses",
    response={201: PauseOut, **AUTH_ERRORS},
    summary="Pause an agent and/or a tool (new runs and actions it covers get 409 paused)",
)
def pause_create(request: HttpRequest, body: PauseIn) -> Status[PauseOut]:
    key = key_of(request)
    pause = ledger_pauses.pause_create(
        tenant=key.tenant, actor=Actor.for_key(key), agent=body.agent, tool=body.tool, reason=body.reason
    )
    return Status(201, PauseOut.from_orm(pause))


@router.get("/pauses", response={200: PausePageOut, **AUTH_ERRORS}, summary="Pauses, newest first")
def pause_list(request: HttpRequest, filters: Query[PauseFilters]) -> PausePageOut:
    page = ledger_pauses.pauses_list(
        tenant_ids=[key_of(request).tenant_id],
        status=filters.status,
        cursor=filters.cursor,
        limit=filters.limit,
    )
    return PausePageOut.from_orm(page)


@router.post(
    "/pauses/{pause_id}/lift",
    response={200: PauseOut, **WRITE_ERRORS},
    summary="Lift a pause (409 invalid_transition when it was already lifted)",
)
def pause_lift(request: HttpRequest, pause_id: str, body: ReasonIn) -> Status[PauseOut]:
    key = key_of(request)
    pause = ledger_pauses.pause_get(reach=tenant_reach_of(request), pause_id=pause_id)
    lifted = ledger_pauses.pause_lift(pause=pause, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, PauseOut.from_orm(lifted))
