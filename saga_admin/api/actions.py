"""Actions, the ledger: an agent records a planned action (idempotent on its key), starts it and
reports how it went (succeeded, failed, verified, reconciled); it reads one, or a run's page of them.

Every state change goes through ``ledger.services`` or, where one request spans the record and a
decision about it (an action that needs an approval, a failure that opens a recovery item),
through the ``recovery.actions`` function that wraps the ledger's in the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router

from infra import errors
from ledger import selectors as ledger_selectors
from ledger.models import Action
from ledger.services.actions import moves
from recovery import selectors as recovery_selectors
from recovery.actions import approvals, reports
from saga_admin.api import reads
from saga_admin.api.auth import AUTH_ERRORS, agent_auth, reader_auth
from saga_admin.api.common import (
    WRITE_ERRORS,
    action_for,
    action_reference,
    actor_of,
    check_id,
    idempotency_header,
    key_of,
    tenant_of,
)
from saga_admin.api.idempotency import idempotent_response, json_response
from saga_admin.api.schemas.actions import (
    ActionFailIn,
    ActionIn,
    ActionOut,
    ActionPageOut,
    ActionPageQuery,
    ActionReconcileIn,
    ActionSucceedIn,
    ActionVerifyIn,
    ActionVerifyOut,
    action_shown,
)
from saga_admin.api.schemas.queue import RecoveryItemOut

# Writes as an agent unless an operation says ``auth=reader_auth`` (saga_admin.api.common).
router = Router(tags=["agents"], auth=agent_auth)


def _action_out(action: Action, *, fresh: bool = False) -> ActionOut:
    """The action as the API shows it. ``fresh``: the instance already holds what this request
    read and wrote in its transaction (a service's compare-and-set sets the fields it updates), so
    it is not read again. Only an action that needs approval can have one (approvals of actions
    are opened by ``action_record_gated`` for exactly those)."""
    if not fresh:
        action.refresh_from_db()
    approval = (
        recovery_selectors.latest_action_approvals(run_id=action.run_id, action_id=action.pk).get(action.pk)
        if action.requires_approval
        else None
    )
    return action_shown(action, approval)


@router.get(
    "/runs/{run_id}/actions",
    response={200: ActionPageOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run's actions, oldest first (cursor pagination, limit ≤ 500)",
)
def run_actions(request: HttpRequest, run_id: str, page: Query[ActionPageQuery]) -> ActionPageOut:
    check_id("Run", run_id)
    return reads.actions_page(key=key_of(request), run_id=run_id, cursor=page.cursor, limit=page.limit)


@router.post(
    "/runs/{run_id}/actions",
    response={200: ActionOut, 201: ActionOut, **WRITE_ERRORS},
    summary="Record a planned action (idempotent on its key)",
    description="201 when recorded; 200 with `Idempotent-Replayed: true` when the key was seen before "
    "with the same payload (the action as it is now, with its result once succeeded). 409 `paused` "
    "when an operator's active pause covers the tool or the run's agent (nothing is recorded; "
    "`details` name the pause). With `start: true` an action that needs no approval is returned "
    "`running` (attempt 1, in the same transaction); a replay never starts anything.",
)
def action_record(
    request: HttpRequest, run_id: str, payload: ActionIn, idempotency_key: str | None = idempotency_header()
) -> HttpResponse:
    check_id("Run", run_id)
    # A reference, not a read: the service locks the run's row scoped to this tenant and this
    # agent (404 for an unknown, another tenant's or another agent's run) and reads it fresh
    # there, so it is read once.
    run = ledger_selectors.run_reference_for_write(key=key_of(request), run_id=run_id)
    key = payload.idempotency_key or idempotency_key
    if key is None:
        raise errors.ValidationFailed(
            "idempotency_key is required (in the body or the Idempotency-Key header).",
            details={"errors": [{"field": "idempotency_key", "message": "required"}]},
        )
    if payload.idempotency_key and idempotency_key and payload.idempotency_key != idempotency_key:
        raise errors.ValidationFailed(
            "The body's idempotency_key and the Idempotency-Key header differ.",
            details={"idempotency_key": payload.idempotency_key, "header": idempotency_key},
        )
    recorded = approvals.action_record_gated(
        run=run,
        actor=actor_of(request),
        tool=payload.tool,
        idempotency_key=key,
        target_type=payload.target_type,
        target_id=payload.target_id,
        args=payload.args,
        intent=payload.intent.model_dump(exclude_unset=True) if payload.intent else {},
        before_snapshot=payload.before_snapshot,
        compensation=payload.compensation.model_dump() if payload.compensation else None,
        via=payload.via.model_dump() if payload.via else None,
        start=payload.start,
    )
    # A new action is built from the row just inserted (and its approval, when one was opened);
    # a replay was read from the database by the service.
    body = _action_out(recorded.action, fresh=True).json_ready()
    return json_response(201, body) if recorded.created else json_response(200, body, replayed=True)


@router.get(
    "/actions/{action_id}",
    response={200: ActionOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="An action with its approval decision (poll this while awaiting_approval)",
)
def action_detail(request: HttpRequest, action_id: str) -> ActionOut:
    # Just read (with its run): not read again.
    return _action_out(action_for(request, action_id), fresh=True)


@router.post(
    "/actions/{action_id}/start",
    response={200: ActionOut, **WRITE_ERRORS},
    summary="planned/approved/failed → running (409 approval_pending / approval_rejected when gated)",
)
def action_start(
    request: HttpRequest, action_id: str, idempotency_key: str | None = idempotency_header()
) -> HttpResponse:
    action = action_reference(request, action_id)

    def produce() -> tuple[int, Any]:
        moves.action_start(action=action, actor=actor_of(request))
        return 200, _action_out(action, fresh=True).json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/succeed", response={200: ActionOut, **WRITE_ERRORS}, summary="running → succeeded"
)
def action_succeed(
    request: HttpRequest,
    action_id: str,
    payload: ActionSucceedIn | None = None,
    idempotency_key: str | None = idempotency_header(),
) -> HttpResponse:
    action = action_reference(request, action_id)
    payload = payload or ActionSucceedIn()

    def produce() -> tuple[int, Any]:
        moves.action_succeed(
            action=action,
            actor=actor_of(request),
            result=payload.result,
            after_snapshot=payload.after_snapshot,
        )
        return 200, _action_out(action, fresh=True).json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/fail",
    response={200: ActionOut, **WRITE_ERRORS},
    summary="running → failed, or unknown when the outcome is unknown (queues the run)",
)
def action_fail(
    request: HttpRequest,
    action_id: str,
    payload: ActionFailIn,
    idempotency_key: str | None = idempotency_header(),
) -> HttpResponse:
    action = action_reference(request, action_id)

    def produce() -> tuple[int, Any]:
        reports.action_fail_and_queue(
            action=action,
            actor=actor_of(request),
            error=payload.error,
            retryable=payload.retryable,
            layer=payload.layer,
            outcome_unknown=payload.outcome_unknown,
        )
        return 200, _action_out(action, fresh=True).json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/verify",
    response={200: ActionVerifyOut, **WRITE_ERRORS},
    summary="Record the agent's check of the effect; a mismatch queues the run (verification_failed)",
)
def action_verify(
    request: HttpRequest,
    action_id: str,
    payload: ActionVerifyIn,
    idempotency_key: str | None = idempotency_header(),
) -> HttpResponse:
    action = action_for(request, action_id, write=True)

    def produce() -> tuple[int, Any]:
        _, item = reports.action_verify_and_queue(
            action=action,
            actor=actor_of(request),
            ok=payload.ok,
            expected=payload.expected,
            actual=payload.actual,
            reason=payload.reason,
        )
        verified = ActionVerifyOut(
            **dict(_action_out(action)),
            recovery_item=RecoveryItemOut.from_orm(item) if item is not None else None,
        )
        return 200, verified.json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/reconcile",
    response={200: ActionOut, **WRITE_ERRORS},
    summary="unknown → succeeded (it happened) or failed (it did not)",
)
def action_reconcile(
    request: HttpRequest,
    action_id: str,
    payload: ActionReconcileIn,
    idempotency_key: str | None = idempotency_header(),
) -> HttpResponse:
    action = action_for(request, action_id, write=True)

    def produce() -> tuple[int, Any]:
        moves.action_reconcile(
            action=action,
            actor=actor_of(request),
            happened=payload.happened,
            reason=payload.reason,
            result=payload.result,
            after_snapshot=payload.after_snapshot,
        )
        return 200, _action_out(action).json_ready()

    return idempotent_response(request, tenant=tenant_of(request), key=idempotency_key, produce=produce)
