"""The agent-facing REST API: runs, actions (the ledger), checkpoints, commands, trail, policies.

Views are authentication + typed parsing + one service call. Every state change goes through
``ledger.services`` or, where one request spans the record and a decision about it (a failure
that opens a recovery item, an action that needs an approval), through the ``recovery.services``
function that wraps the ledger's in the same transaction. This module composes the two apps, so
it lives above both, in ``saga_admin/api/``: ``ledger/`` never imports ``recovery/``.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Header, Query, Router

from ledger import errors
from ledger import selectors as ledger_selectors
from ledger.audit import Actor
from ledger.ids import looks_like_id
from ledger.models import Action, AgentKey, Checkpoint, Run, Tenant
from ledger.pagination import NEWEST_FIRST, keyset_page
from ledger.policies import policies_in_force, policy_settings_for
from ledger.services import actions, checkpoints, runs
from recovery import commands
from recovery import selectors as recovery_selectors
from recovery.models import AgentCommand
from recovery.services import approving, reports
from recovery.trail import run_trail
from saga_admin.api.auth import AUTH_ERRORS, ErrorOut, agent_auth, reader_auth
from saga_admin.api.idempotency import (
    HEADER,
    KEY_PATTERN,
    REPLAYED_HEADER,
    idempotent_response,
    json_response,
)
from saga_admin.api.limits import refuse_over_url_rate
from saga_admin.api.schemas import (
    ActionFailIn,
    ActionIn,
    ActionOut,
    ActionPageOut,
    ActionPageQuery,
    ActionReconcileIn,
    ActionSucceedIn,
    ActionVerifyIn,
    ActionVerifyOut,
    AgentCommandOut,
    AgentCommandsOut,
    CheckpointIn,
    CheckpointOut,
    CheckpointPageOut,
    HeartbeatIn,
    HeartbeatOut,
    PageQuery,
    PoliciesOut,
    RunCompleteIn,
    RunDetailOut,
    RunFailIn,
    RunFailOut,
    RunIn,
    RunListQuery,
    RunOut,
    RunPageOut,
    TrailOut,
    action_out,
    checkpoint_out,
    command_out,
    recovery_item_out,
    run_out,
)

# Every operation writes as an agent (the ``agent`` scope) unless it says ``auth=reader_auth``:
# reads also serve keys with the ``operator`` scope. Which runs a key reaches is
# ``ledger.selectors.run_reach``: an agent its own runs, an operator key every run for reading.
router = Router(tags=["agents"], auth=agent_auth)

# Errors of operations that change state: 409 for a transition the state machine refuses, a run
# that takes no more actions, or an Idempotency-Key still in flight.
WRITE_ERRORS: dict[int, Any] = {**AUTH_ERRORS, 409: ErrorOut}


IDEMPOTENCY_DOC = (
    "Optional. The same key with the same body replays the original response (with "
    f"`{REPLAYED_HEADER}: true`); with another body → 422 `idempotency_key_reused`; while the first "
    "request is still running → 409 `idempotency_key_in_flight`."
)


def _idempotency_header() -> Any:
    return Header(None, alias=HEADER, description=IDEMPOTENCY_DOC, max_length=255, pattern=KEY_PATTERN)


def _key(request: HttpRequest) -> AgentKey:
    # django-ninja sets request.auth to what the router's auth returned: the agent key.
    return request.auth  # type: ignore[attr-defined]


def _tenant(request: HttpRequest) -> Tenant:
    return _key(request).tenant


def _actor(request: HttpRequest) -> Actor:
    return Actor.for_key(_key(request))


def _check_id(kind: str, pk: str) -> None:
    if not looks_like_id(pk):
        raise errors.NotFound(f"{kind} {pk[:60]} not found.", details={"id": pk[:60]})


def _run(request: HttpRequest, run_id: str, *, write: bool = False) -> Run:
    """The run, if the key reaches it (reading or, with ``write``, writing as its agent); else the
    same 404 as an unknown id or another tenant's run."""
    _check_id("Run", run_id)
    return ledger_selectors.run_get_for_key(key=_key(request), run_id=run_id, write=write)


def _action(request: HttpRequest, action_id: str, *, write: bool = False) -> Action:
    _check_id("Action", action_id)
    return ledger_selectors.action_get_for_key(key=_key(request), action_id=action_id, write=write)


def _action_reference(request: HttpRequest, action_id: str) -> Action:
    """A reference to an action the key reports on: the service's one write call scopes it (and
    fills it in), so it is not read first."""
    _check_id("Action", action_id)
    return ledger_selectors.action_reference_for_write(key=_key(request), action_id=action_id)


def _action_body(action: Action, *, fresh: bool = False) -> dict[str, Any]:
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
    return action_out(action, approval=approval)


# --- Runs ---------------------------------------------------------------------------------------


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
    request: HttpRequest, payload: RunIn, idempotency_key: str | None = _idempotency_header()
) -> HttpResponse:
    if payload.resume_url:
        # The service resolves the URL's host (ledger.outbound): counted per key first.
        refused = refuse_over_url_rate(request)
        if refused is not None:
            return refused

    def produce() -> tuple[int, Any]:
        run = runs.run_create(tenant=_tenant(request), actor=_actor(request), **payload.model_dump())
        return 201, run_out(run)

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.get(
    "/runs",
    response={200: RunPageOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="List runs (newest first): an agent's own, or every run of the tenant for an operator key",
)
def run_list(request: HttpRequest, filters: Query[RunListQuery]) -> dict[str, Any]:
    queryset = ledger_selectors.runs_for_key(_key(request))
    for field in ("status", "agent", "external_id"):
        value = getattr(filters, field)
        if value is not None:
            if "\x00" in value:
                raise errors.ValidationFailed(
                    f"{field} may not contain NUL characters.", details={"field": field}
                )
            queryset = queryset.filter(**{field: value})
    page = keyset_page(queryset, keys=NEWEST_FIRST, cursor=filters.cursor, limit=filters.limit)
    return {"items": [run_out(run) for run in page.items], "next_cursor": page.next_cursor}


def _actions_out(run: Run, rows: list[Action]) -> list[dict[str, Any]]:
    """Actions as the API shows them, with their approvals read in one query for all of them."""
    gated = [action.pk for action in rows if action.requires_approval]
    approvals = recovery_selectors.latest_action_approvals(run_id=run.pk, action_ids=gated) if gated else {}
    return [action_out(action, approval=approvals.get(action.pk)) for action in rows]


@router.get(
    "/runs/{run_id}",
    response={200: RunDetailOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run with its newest actions (at most 100; `actions_next` pages them all)",
)
def run_detail(request: HttpRequest, run_id: str) -> dict[str, Any]:
    run = _run(request, run_id)
    newest, more = ledger_selectors.run_actions_newest(run=run)
    checkpoint = ledger_selectors.checkpoint_latest(run=run)
    return {
        **run_out(run),
        "actions": _actions_out(run, newest),
        # The whole list from its start (request.path is this run's path, under any prefix).
        "actions_next": f"{request.path}/actions" if more else None,
        "latest_checkpoint": checkpoint_out(checkpoint) if checkpoint else None,
        "recovery_item": recovery_item_out(recovery_selectors.item_unresolved(run=run)),
        # Over the whole run, not only the actions shown (reads only what a warning can concern).
        "warnings": ledger_selectors.run_warnings(run=run),
    }


@router.get(
    "/runs/{run_id}/actions",
    response={200: ActionPageOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run's actions, oldest first (cursor pagination, limit ≤ 500)",
)
def run_actions(request: HttpRequest, run_id: str, page: Query[ActionPageQuery]) -> dict[str, Any]:
    run = _run(request, run_id)
    rows = ledger_selectors.run_actions_page(run=run, cursor=page.cursor, limit=page.limit)
    return {"items": _actions_out(run, rows.items), "next_cursor": rows.next_cursor}


@router.post(
    "/runs/{run_id}/heartbeat",
    response={200: HeartbeatOut, **AUTH_ERRORS},
    summary="Prove the agent is alive; returns pending commands",
)
def run_heartbeat(request: HttpRequest, run_id: str, payload: HeartbeatIn | None = None) -> dict[str, Any]:
    _check_id("Run", run_id)
    run = runs.run_heartbeat(
        run=ledger_selectors.run_reference_for_write(key=_key(request), run_id=run_id),
        note=payload.note if payload else "",
    )
    return {
        "run_id": run.pk,
        "status": run.status,
        "last_heartbeat_at": run.last_heartbeat_at,
        "commands": [command_out(command) for command in recovery_selectors.commands_pending(run=run)],
    }


@router.post("/runs/{run_id}/complete", response={200: RunOut, **WRITE_ERRORS}, summary="The run succeeded")
def run_complete(
    request: HttpRequest,
    run_id: str,
    payload: RunCompleteIn | None = None,
    idempotency_key: str | None = _idempotency_header(),
) -> HttpResponse:
    run = _run(request, run_id, write=True)

    def produce() -> tuple[int, Any]:
        runs.run_complete(run=run, actor=_actor(request), summary=payload.summary if payload else "")
        return 200, run_out(run)

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.post(
    "/runs/{run_id}/fail",
    response={200: RunFailOut, **WRITE_ERRORS},
    summary="The run failed: record it and put it in the recovery queue",
)
def run_fail(
    request: HttpRequest, run_id: str, payload: RunFailIn, idempotency_key: str | None = _idempotency_header()
) -> HttpResponse:
    run = _run(request, run_id, write=True)
    failed_action = (
        _action(request, payload.failed_action_id, write=True) if payload.failed_action_id else None
    )

    def produce() -> tuple[int, Any]:
        outcome = reports.run_fail_and_queue(
            run=run,
            actor=_actor(request),
            error=payload.error,
            reason=payload.reason,
            failed_action=failed_action,
        )
        unwind = outcome.unwind
        return 200, {
            **run_out(outcome.run),
            "recovery_item": recovery_item_out(outcome.item),
            "unwind": {"id": unwind.pk, "status": unwind.status, "automatic": unwind.automatic}
            if unwind
            else None,
        }

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.get(
    "/runs/{run_id}/trail",
    response={200: TrailOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="The correction trail: what changed, what was restored, what could not be undone",
)
def run_trail_view(request: HttpRequest, run_id: str) -> dict[str, Any]:
    trail = run_trail(run=_run(request, run_id))
    trail["audit_url"] = request.build_absolute_uri(trail["audit_url"])
    return trail


# --- Commands -----------------------------------------------------------------------------------


@router.get(
    "/runs/{run_id}/commands",
    response={200: AgentCommandsOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="Pending resume/cancel commands for the agent",
)
def run_commands(request: HttpRequest, run_id: str) -> dict[str, Any]:
    run = _run(request, run_id)
    return {"commands": [command_out(command) for command in recovery_selectors.commands_pending(run=run)]}


@router.post(
    "/commands/{command_id}/ack",
    response={200: AgentCommandOut, **WRITE_ERRORS},
    summary="Acknowledge a command (harmless to repeat)",
)
def command_ack(request: HttpRequest, command_id: str) -> dict[str, Any]:
    _check_id("Command", command_id)
    command = ledger_selectors.get_for_tenants(
        AgentCommand.objects.select_related("run__tenant", "checkpoint").filter(
            ledger_selectors.run_reach(_key(request), write=True, path="run__")
        ),
        pk=command_id,
        tenants=_tenant(request),
    )
    return command_out(commands.command_ack(command=command, actor=_actor(request)))


# --- Actions (the ledger) -----------------------------------------------------------------------


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
    request: HttpRequest, run_id: str, payload: ActionIn, idempotency_key: str | None = _idempotency_header()
) -> HttpResponse:
    _check_id("Run", run_id)
    # A reference, not a read: the service locks the run's row scoped to this tenant and this
    # agent (404 for an unknown, another tenant's or another agent's run) and reads it fresh
    # there, so it is read once.
    run = ledger_selectors.run_reference_for_write(key=_key(request), run_id=run_id)
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
    recorded = approving.action_record_gated(
        run=run,
        actor=_actor(request),
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
    body = _action_body(recorded.action, fresh=True)
    return json_response(201, body) if recorded.created else json_response(200, body, replayed=True)


@router.get(
    "/actions/{action_id}",
    response={200: ActionOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="An action with its approval decision (poll this while awaiting_approval)",
)
def action_detail(request: HttpRequest, action_id: str) -> dict[str, Any]:
    return _action_body(_action(request, action_id))


@router.post(
    "/actions/{action_id}/start",
    response={200: ActionOut, **WRITE_ERRORS},
    summary="planned/approved/failed → running (409 approval_pending / approval_rejected when gated)",
)
def action_start(
    request: HttpRequest, action_id: str, idempotency_key: str | None = _idempotency_header()
) -> HttpResponse:
    action = _action_reference(request, action_id)

    def produce() -> tuple[int, Any]:
        actions.action_start(action=action, actor=_actor(request))
        return 200, _action_body(action, fresh=True)

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/succeed", response={200: ActionOut, **WRITE_ERRORS}, summary="running → succeeded"
)
def action_succeed(
    request: HttpRequest,
    action_id: str,
    payload: ActionSucceedIn | None = None,
    idempotency_key: str | None = _idempotency_header(),
) -> HttpResponse:
    action = _action_reference(request, action_id)
    payload = payload or ActionSucceedIn()

    def produce() -> tuple[int, Any]:
        actions.action_succeed(
            action=action, actor=_actor(request), result=payload.result, after_snapshot=payload.after_snapshot
        )
        return 200, _action_body(action, fresh=True)

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/fail",
    response={200: ActionOut, **WRITE_ERRORS},
    summary="running → failed, or unknown when the outcome is unknown (queues the run)",
)
def action_fail(
    request: HttpRequest,
    action_id: str,
    payload: ActionFailIn,
    idempotency_key: str | None = _idempotency_header(),
) -> HttpResponse:
    action = _action_reference(request, action_id)

    def produce() -> tuple[int, Any]:
        reports.action_fail_and_queue(
            action=action,
            actor=_actor(request),
            error=payload.error,
            retryable=payload.retryable,
            layer=payload.layer,
            outcome_unknown=payload.outcome_unknown,
        )
        return 200, _action_body(action, fresh=True)

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/verify",
    response={200: ActionVerifyOut, **WRITE_ERRORS},
    summary="Record the agent's check of the effect; a mismatch queues the run (verification_failed)",
)
def action_verify(
    request: HttpRequest,
    action_id: str,
    payload: ActionVerifyIn,
    idempotency_key: str | None = _idempotency_header(),
) -> HttpResponse:
    action = _action(request, action_id, write=True)

    def produce() -> tuple[int, Any]:
        _, item = reports.action_verify_and_queue(
            action=action,
            actor=_actor(request),
            ok=payload.ok,
            expected=payload.expected,
            actual=payload.actual,
            reason=payload.reason,
        )
        return 200, {**_action_body(action), "recovery_item": recovery_item_out(item)}

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.post(
    "/actions/{action_id}/reconcile",
    response={200: ActionOut, **WRITE_ERRORS},
    summary="unknown → succeeded (it happened) or failed (it did not)",
)
def action_reconcile(
    request: HttpRequest,
    action_id: str,
    payload: ActionReconcileIn,
    idempotency_key: str | None = _idempotency_header(),
) -> HttpResponse:
    action = _action(request, action_id, write=True)

    def produce() -> tuple[int, Any]:
        actions.action_reconcile(
            action=action,
            actor=_actor(request),
            happened=payload.happened,
            reason=payload.reason,
            result=payload.result,
            after_snapshot=payload.after_snapshot,
        )
        return 200, _action_body(action)

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


# --- Checkpoints --------------------------------------------------------------------------------


@router.post(
    "/runs/{run_id}/checkpoints", response={201: CheckpointOut, **WRITE_ERRORS}, summary="Write a checkpoint"
)
def checkpoint_create(
    request: HttpRequest,
    run_id: str,
    payload: CheckpointIn,
    idempotency_key: str | None = _idempotency_header(),
) -> HttpResponse:
    run = _run(request, run_id, write=True)

    def produce() -> tuple[int, Any]:
        checkpoint = checkpoints.checkpoint_write(run=run, actor=_actor(request), **payload.model_dump())
        return 201, checkpoint_out(checkpoint)

    return idempotent_response(request, tenant=_tenant(request), key=idempotency_key, produce=produce)


@router.get(
    "/runs/{run_id}/checkpoints",
    response={200: CheckpointPageOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run's checkpoints, newest first",
)
def checkpoint_list(request: HttpRequest, run_id: str, page: Query[PageQuery]) -> dict[str, Any]:
    run = _run(request, run_id)
    rows = keyset_page(
        Checkpoint.objects.filter(run=run), keys=NEWEST_FIRST, cursor=page.cursor, limit=page.limit
    )
    return {
        "items": [checkpoint_out(checkpoint) for checkpoint in rows.items],
        "next_cursor": rows.next_cursor,
    }


@router.get(
    "/runs/{run_id}/checkpoints/latest",
    response={200: CheckpointOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="A run's latest checkpoint (404 when it has none)",
)
def checkpoint_latest(request: HttpRequest, run_id: str) -> dict[str, Any]:
    checkpoint = ledger_selectors.checkpoint_latest(run=_run(request, run_id))
    if checkpoint is None:
        raise errors.NotFound(f"Run {run_id} has no checkpoint yet.", details={"run_id": run_id})
    return checkpoint_out(checkpoint)


# --- Policies -----------------------------------------------------------------------------------


@router.get(
    "/policies",
    response={200: PoliciesOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="The tool policies in force",
)
def policy_list(request: HttpRequest) -> dict[str, Any]:
    tenant = _tenant(request)
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
                "rules": p.rules,
                "limits": p.limits,
                "scope": "tenant" if p.tenant_id else "global",
                "source": p.source,
            }
            for p in policies_in_force(tenant=tenant)
        ],
        "default_policy": settings_.default_policy,
        "unwind": settings_.unwind,
        "auto_compensate": settings_.auto_compensate,
        "source": settings_.source,
    }
