"""The operator REST API (/recovery, /unwinds, /approvals, /pauses): auth, strict parsing, one
service call.

The operator scope is required for the recovery queue, unwinds and steps, the approver scope for
the approvals (401 without a valid key, 403 without the scope); another tenant's object is a
404. Every decision carries a required reason and is audited with the key as actor.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from django.http import HttpRequest, HttpResponse
from ninja import Field, Header, Query, Router, Schema, Status
from pydantic import StringConstraints

from ledger.audit import Actor
from ledger.models import AgentKey, Checkpoint, Pause
from ledger.pagination import MAX_CURSOR_LENGTH
from ledger.rules import REASON_MAX_LENGTH
from ledger.selectors import get_for_tenants, run_get, run_reach
from ledger.services import pauses as ledger_pauses
from recovery import selectors
from recovery.models import AgentCommand, Approval, RecoveryItem, Unwind, UnwindStep
from recovery.planner import compensation_plan
from recovery.services import approving, cancelling, compensating, resolving
from saga_admin.api.agents import IDEMPOTENCY_DOC
from saga_admin.api.auth import AUTH_ERRORS, ErrorOut, approver_auth, operator_auth, reader_auth
from saga_admin.api.idempotency import HEADER, KEY_PATTERN, idempotent_response
from saga_admin.api.schemas import (
    AgentCommandOut,
    RecoveryItemOut,
    RunOut,
    StrictIn,
    command_out,
    grants_out,
    recovery_item_out,
    run_out,
)

router = Router(tags=["recovery"], auth=operator_auth)

DECISION_ERRORS: dict[int, type[Schema]] = {**AUTH_ERRORS, 409: ErrorOut}


# --- Input -----------------------------------------------------------------------------------


class ReasonIn(StrictIn):
    reason: str = Field(
        ..., min_length=1, max_length=REASON_MAX_LENGTH, description="Why; kept in the audit log."
    )


class ResumeIn(ReasonIn):
    checkpoint_id: str | None = Field(None, description="Resume from this checkpoint (default: the latest).")


ACTION_IDS_DOC = (
    "Undo only these actions (still newest first); the plan's other undoable actions are kept. "
    "Each must be an undoable step of the plan, else 422 naming it."
)
TO_CHECKPOINT_DOC = (
    "Undo only what completed after this checkpoint of the run (completion_seq > its completion_mark); "
    "the rest is kept. Not together with action_ids."
)


class CompensateIn(ReasonIn):
    action_ids: list[Annotated[str, StringConstraints(min_length=1, max_length=40)]] | None = Field(
        None, max_length=1000, description=ACTION_IDS_DOC
    )
    to_checkpoint: str | None = Field(None, min_length=1, max_length=40, description=TO_CHECKPOINT_DOC)
    plan_hash: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="The plan_hash you were shown; a different plan now is 409 plan_changed (nothing starts).",
    )


class PlanQuery(Schema):  # query strings: ?action_ids=a&action_ids=b or ?to_checkpoint=c
    action_ids: list[str] | None = Field(None, max_length=500, description=ACTION_IDS_DOC)
    to_checkpoint: str | None = Field(None, max_length=40, description=TO_CHECKPOINT_DOC)


class ApproveIn(ReasonIn):
    args: dict[str, Any] | None = Field(None, description="Edited arguments; both versions are audited.")
    args_hash: str | None = Field(
        None, description="The args_hash you were shown; refused (409) if it changed."
    )


class ItemFilters(Schema):  # query strings: lax on purpose ("50" is a number here)
    status: str | None = Field(None, description="open | claimed | resolved | unresolved (default) | all")
    reason: str | None = None
    risk: str | None = None
    # Bounded (ten years) so an absurd value is a 422, not an overflow in date arithmetic.
    older_than: int | None = Field(
        None, ge=0, le=5_256_000, description="Only items opened more than this many minutes ago."
    )
    run: str | None = Field(None, description="Only this run's items.")
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(50, ge=1, le=200)


class ApprovalFilters(Schema):
    status: str | None = Field(
        "pending", description="pending (default) | approved | rejected | expired | all"
    )
    kind: str | None = Field(None, description="action | compensation")
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(50, ge=1, le=200)


# --- Output ----------------------------------------------------------------------------------


class ActionBrief(Schema):
    id: str
    tool: str
    status: str
    risk: str
    seq: int


class RunBrief(Schema):
    id: str
    agent: str
    request: str
    status: str
    error: str


class ItemOut(Schema):
    id: str
    run_id: str
    run: RunBrief
    status: str
    reason: str
    risk: str
    suggested_resolution: str
    error: str
    failed_action: ActionBrief | None
    details: dict[str, Any]
    assignee: str | None
    claimed_by: str | None
    resolution: str
    resolution_note: str
    reopened_count: int
    opened_at: datetime
    updated_at: datetime
    resolved_at: datetime | None
    age_s: int


class ItemPageOut(Schema):
    items: list[ItemOut]
    next_cursor: str | None


class GoverningPolicyOut(Schema):
    tool: str
    pattern: str
    scope: str = Field(description="tenant | global | default")
    risk: str
    approval: str
    source: str


class PlanUpstreamOut(Schema):
    performed_on: str = Field(description="The upstream that performed the action (its `via.upstream`).")
    gateway: str = Field(description="The gateway that recorded it (its `via.gateway`).")
    compensator: str = Field(
        description="Where the compensator goes: an MCP server's URL, `webhook`, `python`, or empty (none)."
    )
    reaches: bool = Field(
        description="Whether the compensator reaches that upstream (an MCP compensator on the same URL); "
        "false: the step needs a person."
    )
    message: str = Field(description="Why not, in a sentence (empty when it reaches).")


class PlanStepOut(Schema):
    action_id: str
    action_tool: str
    action_seq: int
    completion_seq: int | None
    action_class: str
    target_type: str
    target_id: str
    tool: str
    args: Any = None
    strategy: str
    requires_approval: bool
    can_undo: bool
    risk: str
    compensator: str
    note: str
    policy: GoverningPolicyOut | None = Field(
        None, description="The compensating tool's policy that governs the step (null: nothing to undo)."
    )
    args_error: str = Field(
        "", description="Why the args cannot be filled from the action (the step will fail)."
    )
    upstream: PlanUpstreamOut | None = Field(
        None,
        description="For an action recorded through a gateway: where it was performed and whether the "
        "compensator reaches it (null: the action names no upstream).",
    )


class SelectionOut(Schema):
    mode: str = Field(description="all | action_ids | to_checkpoint")
    action_ids: list[str] = Field(description="The actions whose steps run (all: every step).")
    checkpoint_id: str | None
    checkpoint_name: str


class PlanOut(Schema):
    run_id: str
    plan_hash: str = Field(
        description="The whole plan's fingerprint (every step in order: action, tool, args, strategy, "
        "can_undo, requires_approval); send it back with compensate."
    )
    steps: list[PlanStepOut] = Field(description="What would run, newest action first.")
    kept: list[PlanStepOut] = Field(description="Undoable steps the selection leaves out: kept as they are.")
    selection: SelectionOut
    warnings: list[dict[str, Any]]
    needs_approval: int
    cannot_undo: int


class ResumePreviewOut(Schema):
    run_id: str
    checkpoint_id: str | None
    checkpoint_name: str | None
    stale: bool
    succeeded_after: list[dict[str, Any]]
    repeats: list[dict[str, Any]]
    unknown: list[dict[str, Any]]
    warnings: list[dict[str, Any]]


class StepOut(Schema):
    id: str
    position: int
    action_id: str
    action_tool: str
    tool: str
    args: Any = None
    strategy: str
    requires_approval: bool
    approval_id: str | None
    status: str
    attempts: int
    max_attempts: int
    error: str
    result: Any = None
    started_at: datetime | None
    finished_at: datetime | None


class UnwindOut(Schema):
    id: str
    run_id: str
    item_id: str | None
    status: str
    automatic: bool
    on_failure: str
    reason: str
    created_at: datetime
    finished_at: datetime | None
    steps: list[StepOut]


class ItemDetailOut(ItemOut):
    plan: PlanOut
    resume_preview: ResumePreviewOut
    unwinds: list[str]


class CommandOut(Schema):
    id: str
    kind: str
    run_id: str
    checkpoint_id: str | None
    status: str
    reason: str
    created_at: datetime


class ApprovalGrantOut(Schema):
    by: str = Field(
        description="The person: a dashboard user's name, or `<owner> (approver key <name>)` for a "
        "grant through a key they own."
    )
    reason: str
    at: datetime


class ApprovalOut(Schema):
    id: str
    kind: str
    run_id: str
    action_id: str
    step_id: str | None
    status: str
    risk: str
    tool: str
    args: Any = None
    args_hash: str
    approved_args: Any = None
    reason: str
    expires_at: datetime
    created_at: datetime
    decided_at: datetime | None
    previous_id: str | None = Field(
        None, description="The expired or rejected approval this one asks again (request-again)."
    )
    approvers_required: int = Field(
        1, description="How many distinct people must grant it; the requester never counts."
    )
    grants: list[ApprovalGrantOut] = Field(
        default_factory=list,
        description="The grants so far of an approval that needs several people (it stays pending until the last).",
    )


class ApprovalPageOut(Schema):
    items: list[ApprovalOut]
    next_cursor: str | None


# --- Serialisers -----------------------------------------------------------------------------


def _user_label(user: Any) -> str | None:
    return user.get_username() if user is not None else None


def _item_out(item: RecoveryItem) -> dict[str, Any]:
    action = item.failed_action
    return {
        "id": item.pk,
        "run_id": item.run_id,
        "run": {
            "id": item.run.pk,
            "agent": item.run.agent,
            "request": item.run.request,
            "status": item.run.status,
            "error": item.run.error,
        },
        "status": item.status,
        "reason": item.reason,
        "risk": item.risk,
        "suggested_resolution": item.suggested_resolution,
        "error": item.error,
        "failed_action": (
            {
                "id": action.pk,
                "tool": action.tool,
                "status": action.status,
                "risk": action.risk,
                "seq": action.seq,
            }
            if action is not None
            else None
        ),
        "details": item.details,
        "assignee": _user_label(item.assignee),
        "claimed_by": _user_label(item.claimed_by),
        "resolution": item.resolution,
        "resolution_note": item.resolution_note,
        "reopened_count": item.reopened_count,
        "opened_at": item.opened_at,
        "updated_at": item.updated_at,
        "resolved_at": item.resolved_at,
        "age_s": selectors.item_age_seconds(item),
    }


def _step_out(step: UnwindStep) -> dict[str, Any]:
    approval = getattr(step, "approval", None)  # reverse one-to-one: absent → None
    return {
        "id": step.pk,
        "position": step.position,
        "action_id": step.action_id,
        "action_tool": step.action.tool,
        "tool": step.tool,
        "args": step.args,
        "strategy": step.strategy,
        "requires_approval": step.requires_approval,
        "approval_id": getattr(approval, "pk", None),
        "status": step.status,
        "attempts": step.attempts,
        "max_attempts": step.max_attempts,
        "error": step.error,
        "result": step.result,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
    }


def _unwind_out(unwind: Unwind) -> dict[str, Any]:
    return {
        "id": unwind.pk,
        "run_id": unwind.run_id,
        "item_id": unwind.item_id,
        "status": unwind.status,
        "automatic": unwind.automatic,
        "on_failure": unwind.on_failure,
        "reason": unwind.reason,
        "created_at": unwind.created_at,
        "finished_at": unwind.finished_at,
        "steps": [_step_out(s) for s in selectors.unwind_steps(unwind=unwind)],
    }


def _command_out(command: AgentCommand) -> dict[str, Any]:
    return {
        "id": command.pk,
        "kind": command.kind,
        "run_id": command.run_id,
        "checkpoint_id": command.checkpoint_id,
        "status": command.status,
        "reason": command.reason,
        "created_at": command.created_at,
    }


def _approval_out(approval: Approval) -> dict[str, Any]:
    return {
        "id": approval.pk,
        "kind": approval.kind,
        "run_id": approval.run_id,
        "action_id": approval.action_id,
        "step_id": approval.step_id,
        "status": approval.status,
        "risk": approval.risk,
        "tool": approval.tool,
        "args": approval.args,
        "args_hash": approval.args_hash,
        "approved_args": approval.approved_args,
        "reason": approval.reason,
        "expires_at": approval.expires_at,
        "created_at": approval.created_at,
        "decided_at": approval.decided_at,
        "previous_id": approval.previous_id,
        "approvers_required": approval.approvers_required,
        "grants": grants_out(approval),
    }


def _key(request: HttpRequest) -> AgentKey:
    key = request.auth  # type: ignore[attr-defined]
    assert isinstance(key, AgentKey)
    return key


# --- Recovery queue --------------------------------------------------------------------------


@router.get("/recovery", response={200: ItemPageOut, **AUTH_ERRORS}, summary="The recovery queue")
def recovery_list(request: HttpRequest, filters: Query[ItemFilters]) -> Any:
    page = selectors.items_list(
        tenants=_key(request).tenant,
        status=filters.status,
        reason=filters.reason,
        risk=filters.risk,
        older_than_minutes=filters.older_than,
        run_id=filters.run,
        cursor=filters.cursor,
        limit=filters.limit,
    )
    return {"items": [_item_out(i) for i in page.items], "next_cursor": page.next_cursor}


@router.get(
    "/recovery/{item_id}",
    response={200: ItemDetailOut, **AUTH_ERRORS},
    summary="A recovery item with its compensation plan and resume preview",
)
def recovery_detail(request: HttpRequest, item_id: str, selection: Query[PlanQuery]) -> Any:
    item = selectors.item_get(tenants=_key(request).tenant, item_id=item_id)
    plan = compensation_plan(
        run=item.run, action_ids=selection.action_ids, to_checkpoint=selection.to_checkpoint
    )
    return {
        **_item_out(item),
        "plan": plan.as_dict(),
        "resume_preview": selectors.resume_preview(item=item).as_dict(),
        "unwinds": [u.pk for u in selectors.unwinds_for_run(run_id=item.run_id)],
    }


@router.post(
    "/recovery/{item_id}/compensate",
    response={202: UnwindOut, **DECISION_ERRORS},
    summary="Compensate the run (LIFO unwind on the workers)",
)
def recovery_compensate(request: HttpRequest, item_id: str, body: CompensateIn) -> Any:
    key = _key(request)
    item = selectors.item_get(tenants=key.tenant, item_id=item_id)
    unwind = compensating.unwind_start(
        item=item,
        actor=Actor.for_key(key),
        reason=body.reason,
        action_ids=body.action_ids,
        to_checkpoint=body.to_checkpoint,
        plan_hash=body.plan_hash,
    )
    return Status(202, _unwind_out(unwind))


@router.post(
    "/recovery/{item_id}/resume",
    response={202: CommandOut, **DECISION_ERRORS},
    summary="Resume the run from a checkpoint (issues a resume command)",
)
def recovery_resume(request: HttpRequest, item_id: str, body: ResumeIn) -> Any:
    key = _key(request)
    item = selectors.item_get(tenants=key.tenant, item_id=item_id)
    checkpoint = None
    if body.checkpoint_id:
        checkpoint = get_for_tenants(Checkpoint.objects.all(), pk=body.checkpoint_id, tenants=key.tenant)
    command = resolving.item_resume(
        item=item, actor=Actor.for_key(key), reason=body.reason, checkpoint=checkpoint
    )
    return Status(202, _command_out(command))


@router.post(
    "/recovery/{item_id}/close", response={200: ItemOut, **DECISION_ERRORS}, summary="Close the item"
)
def recovery_close(request: HttpRequest, item_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    item = selectors.item_get(tenants=key.tenant, item_id=item_id)
    resolving.item_close(item=item, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, _item_out(selectors.item_get(tenants=key.tenant, item_id=item_id)))


@router.post(
    "/runs/{run_id}/flag",
    response={201: ItemOut, **DECISION_ERRORS},
    summary="Flag any run (also a succeeded one) for review: its recovery item (reason manual)",
)
def run_flag(request: HttpRequest, run_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    run = run_get(tenant=key.tenant, run_id=run_id)
    item = resolving.run_flag(run=run, actor=Actor.for_key(key), reason=body.reason)
    return Status(201, _item_out(selectors.item_get(tenants=key.tenant, item_id=item.pk)))


# --- Unwinds ---------------------------------------------------------------------------------


@router.get(
    "/unwinds/{unwind_id}", response={200: UnwindOut, **AUTH_ERRORS}, summary="An unwind and its steps"
)
def unwind_detail(request: HttpRequest, unwind_id: str) -> Any:
    return _unwind_out(selectors.unwind_get(tenants=_key(request).tenant, unwind_id=unwind_id))


@router.post(
    "/unwind-steps/{step_id}/retry",
    response={200: StepOut, **DECISION_ERRORS},
    summary="Retry a failed or drifted step (drifted: retry anyway)",
)
def step_retry(request: HttpRequest, step_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    step = selectors.step_get(tenants=key.tenant, step_id=step_id)
    compensating.step_retry(step=step, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, _step_out(selectors.step_get(tenants=key.tenant, step_id=step_id)))


@router.post(
    "/unwind-steps/{step_id}/skip",
    response={200: StepOut, **DECISION_ERRORS},
    summary="Leave a failed or drifted step undone; the unwind continues",
)
def step_skip(request: HttpRequest, step_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    step = selectors.step_get(tenants=key.tenant, step_id=step_id)
    compensating.step_skip(step=step, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, _step_out(selectors.step_get(tenants=key.tenant, step_id=step_id)))


# --- Approvals -------------------------------------------------------------------------------
# Only approver keys decide (an operator key does not: an automation holding one key would
# approve its own requests), and never what their own agent or automation asked for
# (403 self_approval, recovery.approvals.is_requester).


@router.get(
    "/approvals",
    response={200: ApprovalPageOut, **AUTH_ERRORS},
    auth=approver_auth,
    summary="The approval inbox (approver scope)",
)
def approvals_list(request: HttpRequest, filters: Query[ApprovalFilters]) -> Any:
    page = selectors.approvals_list(
        tenants=_key(request).tenant,
        status=filters.status,
        kind=filters.kind,
        cursor=filters.cursor,
        limit=filters.limit,
    )
    return {"items": [_approval_out(a) for a in page.items], "next_cursor": page.next_cursor}


@router.post(
    "/approvals/{approval_id}/approve",
    response={200: ApprovalOut, **DECISION_ERRORS},
    auth=approver_auth,
    summary="Approve (optionally with edited args; approver scope, never your own request)",
)
def approval_approve(request: HttpRequest, approval_id: str, body: ApproveIn) -> Any:
    key = _key(request)
    approval = selectors.approval_get(tenants=key.tenant, approval_id=approval_id)
    decided = approving.approval_approve(
        approval=approval,
        actor=Actor.for_key(key),
        reason=body.reason,
        args=body.args,
        shown_args_hash=body.args_hash,
    )
    return Status(200, _approval_out(decided))


@router.post(
    "/approvals/{approval_id}/reject",
    response={200: ApprovalOut, **DECISION_ERRORS},
    auth=approver_auth,
    summary="Reject with a reason (approver scope)",
)
def approval_reject(request: HttpRequest, approval_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    approval = selectors.approval_get(tenants=key.tenant, approval_id=approval_id)
    decided = approving.approval_reject(approval=approval, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, _approval_out(decided))


# --- Cancel a run ----------------------------------------------------------------------------


class RunCancelOut(RunOut):
    command: AgentCommandOut = Field(description="The cancel command the agent is given.")
    unknown_action_ids: list[str] = Field(
        description="The actions that were running: their outcome is now unknown (reconcile them)."
    )
    recovery_item: RecoveryItemOut | None = Field(
        None, description="The run's item (reason cancelled) when it changed something; else null."
    )


@router.post(
    "/runs/{run_id}/cancel",
    response={200: RunCancelOut, **DECISION_ERRORS},
    summary="Cancel a running (or failed) run: the agent is told to stop and can write no more",
)
def run_cancel(
    request: HttpRequest,
    run_id: str,
    body: ReasonIn,
    idempotency_key: str | None = Header(
        None, alias=HEADER, description=IDEMPOTENCY_DOC, max_length=255, pattern=KEY_PATTERN
    ),
) -> HttpResponse:
    key = _key(request)
    run = run_get(tenant=key.tenant, run_id=run_id)
    actor = Actor.for_key(key)

    def produce() -> tuple[int, Any]:
        outcome = cancelling.run_cancel(run=run, actor=actor, reason=body.reason)
        return 200, {
            **run_out(outcome.run),
            "command": command_out(outcome.command),
            "unknown_action_ids": [a.pk for a in outcome.unknown],
            "recovery_item": recovery_item_out(outcome.item),
        }

    return idempotent_response(request, tenant=key.tenant, key=idempotency_key, produce=produce)


# --- Pauses (kill switches) ------------------------------------------------------------------
# While a pause is active, new runs of a matching agent and new actions it covers are refused with
# 409 ``paused`` (ledger.services.pauses); pausing and lifting are audited with the key as actor.


class PauseIn(StrictIn):
    agent: str = Field(
        "",
        max_length=ledger_pauses.NAME_MAX_LENGTH,
        description="Agent name or glob: matches the agent that owns a run (its key's name) or the "
        "agent the run declares. New runs of it, and new actions in its runs, are refused.",
    )
    tool: str = Field(
        "",
        max_length=ledger_pauses.NAME_MAX_LENGTH,
        description="Tool name or glob (payments.*): new actions of it are refused (with agent: only "
        "in that agent's runs). At least one of agent and tool.",
    )
    reason: str = Field(
        ..., min_length=1, max_length=REASON_MAX_LENGTH, description="Why; kept in the audit log."
    )


class PauseFilters(Schema):
    status: str | None = Field("active", description="active (default) | lifted | all")
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(50, ge=1, le=200)


class PauseOut(Schema):
    id: str
    agent: str
    tool: str
    status: str = Field(description="active | lifted")
    reason: str
    created_by: str
    created_at: datetime
    lifted_by: str | None
    lifted_at: datetime | None
    lift_reason: str


class PausePageOut(Schema):
    items: list[PauseOut]
    next_cursor: str | None


def _pause_out(pause: Pause) -> dict[str, Any]:
    return {
        "id": pause.pk,
        "agent": pause.agent,
        "tool": pause.tool,
        "status": "active" if pause.is_active else "lifted",
        "reason": pause.reason,
        "created_by": ledger_pauses.created_by_label(pause),
        "created_at": pause.created_at,
        "lifted_by": None if pause.is_active else ledger_pauses.lifted_by_label(pause),
        "lifted_at": pause.lifted_at,
        "lift_reason": pause.lift_reason,
    }


@router.post(
    "/pauses",
    response={201: PauseOut, **AUTH_ERRORS},
    summary="Pause an agent and/or a tool (new runs and actions it covers get 409 paused)",
)
def pause_create(request: HttpRequest, body: PauseIn) -> Any:
    key = _key(request)
    pause = ledger_pauses.pause_create(
        tenant=key.tenant, actor=Actor.for_key(key), agent=body.agent, tool=body.tool, reason=body.reason
    )
    return Status(201, _pause_out(pause))


@router.get("/pauses", response={200: PausePageOut, **AUTH_ERRORS}, summary="Pauses, newest first")
def pause_list(request: HttpRequest, filters: Query[PauseFilters]) -> Any:
    page = ledger_pauses.pauses_list(
        tenant_ids=[_key(request).tenant_id],
        status=filters.status,
        cursor=filters.cursor,
        limit=filters.limit,
    )
    return {"items": [_pause_out(p) for p in page.items], "next_cursor": page.next_cursor}


@router.post(
    "/pauses/{pause_id}/lift",
    response={200: PauseOut, **DECISION_ERRORS},
    summary="Lift a pause (409 invalid_transition when it was already lifted)",
)
def pause_lift(request: HttpRequest, pause_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    pause = ledger_pauses.pause_get(tenant_ids=[key.tenant_id], pause_id=pause_id)
    lifted = ledger_pauses.pause_lift(pause=pause, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, _pause_out(lifted))


# --- Stopping an unwind, asking again for an approval ----------------------------------------


@router.post(
    "/unwinds/{unwind_id}/stop",
    response={200: UnwindOut, **DECISION_ERRORS},
    summary="Stop a running unwind between steps; its item goes back to the queue",
)
def unwind_stop(request: HttpRequest, unwind_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    unwind = selectors.unwind_get(tenants=key.tenant, unwind_id=unwind_id)
    compensating.unwind_stop(unwind=unwind, actor=Actor.for_key(key), reason=body.reason)
    return Status(200, _unwind_out(selectors.unwind_get(tenants=key.tenant, unwind_id=unwind_id)))


@router.post(
    "/approvals/{approval_id}/request-again",
    response={201: ApprovalOut, **DECISION_ERRORS},
    auth=reader_auth,
    summary="Ask again for an expired or rejected approval (the owning agent for its action; an operator for a step)",
)
def approval_request_again(request: HttpRequest, approval_id: str, body: ReasonIn) -> Any:
    key = _key(request)
    # An agent key reaches only its own runs' approvals (another agent's is a 404, like another
    # tenant's); who may ask again for which kind is the service's rule.
    approval = get_for_tenants(
        Approval.objects.select_related("run__tenant", "action", "step").filter(run_reach(key, path="run__")),
        pk=approval_id,
        tenants=key.tenant,
    )
    asked = approving.approval_request_again(approval=approval, actor=Actor.for_key(key), reason=body.reason)
    return Status(201, _approval_out(asked))
