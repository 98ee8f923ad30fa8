"""Runs: an agent starts, lists, reads, heartbeats, completes and fails its runs and reads their
correction trail; an operator cancels one (the ``operator`` scope, with the rest of the operator's
API under the ``recovery`` tag).

Every state change goes through ``ledger.services`` or, where one request spans the record and a
decision about it (a failure that opens a recovery item), through the ``recovery.actions``
function that wraps the ledger's in the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router

from infra import errors
from infra.pagination import NEWEST_FIRST, keyset_page
from ledger import selectors as ledger_selectors
from ledger.audit import Actor
from ledger.selectors import run_get
from ledger.services import runs
from recovery import selectors as recovery_selectors
from recovery.actions import cancellations, reports
from recovery.trail import run_trail
from saga_admin.api import reads
from saga_admin.api.auth import AUTH_ERRORS, agent_auth, operator_auth, reader_auth
from saga_admin.api.common import (
    WRITE_ERRORS,
    action_for,
    actor_of,
    check_id,
    idempotency_header,
    key_of,
    reach_of,
    run_for,
    tenant_of,
    tenant_reach_of,
)
from saga_admin.api.idempotency import idempotent_response
from saga_admin.api.limits import refuse_over_url_rate
from saga_admin.api.schemas.commands import CommandOut
from saga_admin.api.schemas.common import ReasonIn
from saga_admin.api.schemas.queue import RecoveryItemOut
from saga_admin.api.schemas.runs import (
    HeartbeatIn,
    HeartbeatOut,
    RunCancelOut,
    RunCompleteIn,
    RunDetailOut,
    RunFailIn,
    RunFailOut,
    RunIn,
    RunListQuery,
    RunOut,
    RunPageOut,
    TrailOut,
    UnwindRefOut,
)

# Writes as an agent unless an operation says ``auth=reader_auth`` (saga_admin.api.common).
router = Router(tags=["agents"], auth=agent_auth)


@router.post(
    "/runs",
    response={201: RunOut, **WRITE_ERRORS},
    summary="Start a run",
    description="409 `paused` when an operator's active pause covers the agent (the key's name or the "
    "`agent` sent); `details` name the pause (`pause_id`, `agent`, `tool`). With a `resume_url`, "
    "429 `rate_limited` (with `Retry-After`) once the key has sent more than `SAGA_URL_RATE` "
    "requests carrying a URL in the window; nothing is created.",
)
def run_create(
    request: HttpRequest, payload: RunIn, idempotency_key: str | None = idempotency_header()
) -> HttpResponse:
    if payload.resume_url:
        # The service resolves the URL's host (infra.outbound): counted per key first.
        refused = refuse_over_url_rate(request)
        if refused is not None:
            return refused

    def produce() -> tuple[int, Any]:
        run = runs.run_create(tenant=tenant_of(request), actor=actor_of(request), **payload.model_dump())
        return 201, RunOut.from_orm(run).json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.get(
    "/runs",
    response={200: RunPageOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="List runs (newest first): an agent's own, or every run of the tenant for an operator key",
)
def run_list(request: HttpRequest, filters: Query[RunListQuery]) -> RunPageOut:
    queryset = ledger_selectors.runs_reached(reach=reach_of(request))
    for field in ("status", "agent", "external_id"):
        value = getattr(filters, field)
        if value is not None:
            if "\x00" in value:
                raise errors.ValidationFailed(
                    f"{field} may not contain NUL characters.", details={"field": field}
                )
            queryset = queryset.filter(**{field: value})
    page = keyset_page(queryset, keys=NEWEST_FIRST, cursor=filters.cursor, limit=filters.limit)
    # Built once, from the runs: ninja does not validate an output it is handed again.
    return RunPageOut(items=[RunOut.from_orm(run) for run in page.items], next_cursor=page.next_cursor)


@router.get(
    "/runs/{run_id}",
    response={200: RunDetailOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run with its newest actions (at most 100; `actions_next` pages them all)",
)
def run_detail(request: HttpRequest, run_id: str) -> RunDetailOut:
    check_id("Run", run_id)
    # One statement (saga_admin.api.reads); request.path is this run's path, under any prefix.
    return reads.run_detail(key=key_of(request), run_id=run_id, path=request.path)


@router.post(
    "/runs/{run_id}/heartbeat",
    response={200: HeartbeatOut, **AUTH_ERRORS},
    summary="Prove the agent is alive; returns pending commands",
)
def run_heartbeat(request: HttpRequest, run_id: str, payload: HeartbeatIn | None = None) -> dict[str, Any]:
    check_id("Run", run_id)
    run = runs.run_heartbeat(
        run=ledger_selectors.run_reference_for_write(key=key_of(request), run_id=run_id),
        note=payload.note if payload else "",
    )
    return {
        "run_id": run.pk,
        "status": run.status,
        "last_heartbeat_at": run.last_heartbeat_at,
        "commands": [
            CommandOut.from_orm(command) for command in recovery_selectors.commands_pending(run=run)
        ],
    }


@router.post("/runs/{run_id}/complete", response={200: RunOut, **WRITE_ERRORS}, summary="The run succeeded")
def run_complete(
    request: HttpRequest,
    run_id: str,
    payload: RunCompleteIn | None = None,
    idempotency_key: str | None = idempotency_header(),
) -> HttpResponse:
    run = run_for(request, run_id, write=True)

    def produce() -> tuple[int, Any]:
        completed = reports.run_complete(
            run=run,
            actor=actor_of(request),
            summary=payload.summary if payload else "",
            withdraw_approvals=payload.withdraw_approvals if payload else False,
        )
        return 200, RunOut.from_orm(completed).json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.post(
    "/runs/{run_id}/fail",
    response={200: RunFailOut, **WRITE_ERRORS},
    summary="The run failed: record it and put it in the recovery queue",
)
def run_fail(
    request: HttpRequest, run_id: str, payload: RunFailIn, idempotency_key: str | None = idempotency_header()
) -> HttpResponse:
    run = run_for(request, run_id, write=True)
    failed_action = (
        action_for(request, payload.failed_action_id, write=True) if payload.failed_action_id else None
    )

    def produce() -> tuple[int, Any]:
        outcome = reports.run_fail_and_queue(
            run=run,
            actor=actor_of(request),
            error=payload.error,
            reason=payload.reason,
            failed_action=failed_action,
            withdraw_approvals=payload.withdraw_approvals,
        )
        failed = RunFailOut(
            **dict(RunOut.from_orm(outcome.run)),
            recovery_item=RecoveryItemOut.from_orm(outcome.item) if outcome.item is not None else None,
            unwind=UnwindRefOut.from_orm(outcome.unwind) if outcome.unwind is not None else None,
        )
        return 200, failed.json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.get(
    "/runs/{run_id}/trail",
    response={200: TrailOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="The correction trail: what changed, what was restored, what could not be undone",
)
def run_trail_view(request: HttpRequest, run_id: str) -> dict[str, Any]:
    trail = run_trail(run=run_for(request, run_id))
    trail["audit_url"] = request.build_absolute_uri(trail["audit_url"])
    return trail


@router.post(
    "/runs/{run_id}/cancel",
    response={200: RunCancelOut, **WRITE_ERRORS},
    auth=operator_auth,
    tags=["recovery"],
    summary="Cancel a running (or failed) run: the agent is told to stop and can write no more",
)
def run_cancel(
    request: HttpRequest,
    run_id: str,
    body: ReasonIn,
    idempotency_key: str | None = idempotency_header(),
) -> HttpResponse:
    key = key_of(request)
    run = run_get(reach=tenant_reach_of(request), run_id=run_id)
    actor = Actor.for_key(key)

    def produce() -> tuple[int, Any]:
        outcome = cancellations.run_cancel(run=run, actor=actor, reason=body.reason)
        cancelled = RunCancelOut(
            **dict(RunOut.from_orm(outcome.run)),
            command=CommandOut.from_orm(outcome.command),
            unknown_action_ids=[a.pk for a in outcome.unknown],
            recovery_item=RecoveryItemOut.from_orm(outcome.item) if outcome.item is not None else None,
        )
        return 200, cancelled.model_dump(mode="json")

    return idempotent_response(request, tenant=key.tenant, key=idempotency_key, produce=produce)
