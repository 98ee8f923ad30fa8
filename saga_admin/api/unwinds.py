"""Unwinds (the ``operator`` scope): one with its steps, stopping a running one between steps, and
a failed or drifted step retried or skipped.

Every decision carries a required reason and is audited with the key as actor; another tenant's
object is a 404.
"""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router, Status

from ledger.audit import Actor
from recovery import selectors
from recovery.actions import compensations
from saga_admin.api.auth import AUTH_ERRORS, operator_auth
from saga_admin.api.common import WRITE_ERRORS, key_of, tenant_reach_of
from saga_admin.api.schemas.common import ReasonIn
from saga_admin.api.schemas.unwinds import StepOut, UnwindOut

router = Router(tags=["recovery"], auth=operator_auth)


@router.get(
    "/unwinds/{unwind_id}", response={200: UnwindOut, **AUTH_ERRORS}, summary="An unwind and its steps"
)
def unwind_detail(request: HttpRequest, unwind_id: str) -> UnwindOut:
    return UnwindOut.from_orm(selectors.unwind_get(reach=tenant_reach_of(request), unwind_id=unwind_id))


@router.post(
    "/unwinds/{unwind_id}/stop",
    response={200: UnwindOut, **WRITE_ERRORS},
    summary="Stop a running unwind between steps; its item goes back to the queue",
)
def unwind_stop(request: HttpRequest, unwind_id: str, body: ReasonIn) -> Status[UnwindOut]:
    key = key_of(request)
    unwind = selectors.unwind_get(reach=tenant_reach_of(request), unwind_id=unwind_id)
    compensations.unwind_stop(unwind=unwind, actor=Actor.for_key(key), reason=body.reason)
    return Status(
        200, UnwindOut.from_orm(selectors.unwind_get(reach=tenant_reach_of(request), unwind_id=unwind_id))
    )


@router.post(
    "/unwind-steps/{step_id}/retry",
    response={200: StepOut, **WRITE_ERRORS},
    summary="Retry a failed or drifted step (drifted: retry anyway)",
)
def step_retry(request: HttpRequest, step_id: str, body: ReasonIn) -> Status[StepOut]:
    key = key_of(request)
    step = selectors.step_get(reach=tenant_reach_of(request), step_id=step_id)
    compensations.step_retry(step=step, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, StepOut.from_orm(selectors.step_get(reach=tenant_reach_of(request), step_id=step_id)))


@router.post(
    "/unwind-steps/{step_id}/skip",
    response={200: StepOut, **WRITE_ERRORS},
    summary="Leave a failed or drifted step undone; the unwind continues",
)
def step_skip(request: HttpRequest, step_id: str, body: ReasonIn) -> Status[StepOut]:
    key = key_of(request)
    step = selectors.step_get(reach=tenant_reach_of(request), step_id=step_id)
    compensations.step_skip(step=step, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, StepOut.from_orm(selectors.step_get(reach=tenant_reach_of(request), step_id=step_id)))
