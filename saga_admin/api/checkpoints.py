"""Checkpoints: an agent writes one (its state, what is done and pending, how to recover from
there) and reads a run's, newest first, or only the latest."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router

from infra import errors
from ledger import selectors as ledger_selectors
from ledger.services import checkpoints
from saga_admin.api import reads
from saga_admin.api.auth import AUTH_ERRORS, agent_auth, reader_auth
from saga_admin.api.common import (
    WRITE_ERRORS,
    actor_of,
    check_id,
    idempotency_header,
    key_of,
    run_for,
    tenant_of,
)
from saga_admin.api.idempotency import idempotent_response
from saga_admin.api.schemas.checkpoints import (
    CheckpointIn,
    CheckpointOut,
    CheckpointPageOut,
    PageQuery,
)

# Writes as an agent unless an operation says ``auth=reader_auth`` (saga_admin.api.common).
router = Router(tags=["agents"], auth=agent_auth)


@router.post(
    "/runs/{run_id}/checkpoints", response={201: CheckpointOut, **WRITE_ERRORS}, summary="Write a checkpoint"
)
def checkpoint_create(
    request: HttpRequest,
    run_id: str,
    payload: CheckpointIn,
    idempotency_key: str | None = idempotency_header(),
) -> HttpResponse:
    run = run_for(request, run_id, write=True)

    def produce() -> tuple[int, Any]:
        checkpoint = checkpoints.checkpoint_write(run=run, actor=actor_of(request), **payload.model_dump())
        return 201, CheckpointOut.from_orm(checkpoint).json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.get(
    "/runs/{run_id}/checkpoints",
    response={200: CheckpointPageOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run's checkpoints, newest first",
)
def checkpoint_list(request: HttpRequest, run_id: str, page: Query[PageQuery]) -> CheckpointPageOut:
    check_id("Run", run_id)
    return reads.checkpoint_page(key=key_of(request), run_id=run_id, cursor=page.cursor, limit=page.limit)


@router.get(
    "/runs/{run_id}/checkpoints/latest",
    response={200: CheckpointOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run's latest checkpoint (404 when it has none)",
)
def checkpoint_latest(request: HttpRequest, run_id: str) -> CheckpointOut:
    checkpoint = ledger_selectors.checkpoint_latest(run=run_for(request, run_id))
    if checkpoint is None:
        raise errors.NotFound(f"Run {run_id} has no checkpoint yet.", details={"run_id": run_id})
    return CheckpointOut.from_orm(checkpoint)
