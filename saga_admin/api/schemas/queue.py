"""The recovery queue: its filters, the decisions on an item (compensate, resume, close), the item
with its compensation plan and resume preview, and the brief item an agent sees on its run."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from ninja import Schema
from pydantic import Field, StringConstraints

from infra.pagination import MAX_CURSOR_LENGTH
from ledger.tool_names import TOOL_GLOB_RULE
from recovery import selectors
from recovery.models import RecoveryItem
from recovery.selectors import FILTER_TEXT_MAX_LENGTH, QueueFilter
from saga_admin.api.schemas.common import Out, ReasonIn


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


# The queue filter's fields as the API names them (GET /recovery's query, a bulk's ``filter``).
STATUS_DOC = "open | claimed | resolved | unresolved (default) | all"
# Bounded (ten years) so an absurd value is a 422, not an overflow in date arithmetic.
OLDER_THAN_MAX_MINUTES = 5_256_000
OLDER_THAN_DOC = "Only items opened more than this many minutes ago."
AGENT_DOC = (
    "Only runs of this agent: the agent the run declared, or the name of the key that owns it (exact)."
)
TOOL_DOC = f"Only items whose failed action's tool is this name or glob (crm.update_*): {TOOL_GLOB_RULE}."
Q_DOC = "Text search: an item, run, external or target id, else part of the failing tool's name or the run's request."


def queue_filter_of(fields: Any) -> QueueFilter:
    """The queue's one filter (``recovery.selectors.QueueFilter``; 422 for an unknown value), from
    the filter fields of a query (``ItemFilters``) or of a bulk decision's body (``BulkFilterIn``,
    which has no ``run``)."""
    older_than = fields.older_than
    return QueueFilter(
        status=fields.status or "unresolved",
        reason=fields.reason or "",
        risk=fields.risk or "",
        older_than=timedelta(minutes=older_than) if older_than is not None else None,
        run_id=getattr(fields, "run", None) or "",
        agent=fields.agent or "",
        tool=fields.tool or "",
        search=fields.q or "",
    )


class ItemFilters(Schema):  # query strings: lax on purpose ("50" is a number here)
    status: str | None = Field(None, max_length=40, description=STATUS_DOC)
    reason: str | None = Field(None, max_length=40)
    risk: str | None = Field(None, max_length=40)
    older_than: int | None = Field(None, ge=0, le=OLDER_THAN_MAX_MINUTES, description=OLDER_THAN_DOC)
    run: str | None = Field(None, max_length=40, description="Only this run's items.")
    agent: str | None = Field(None, max_length=FILTER_TEXT_MAX_LENGTH["agent"], description=AGENT_DOC)
    tool: str | None = Field(None, max_length=FILTER_TEXT_MAX_LENGTH["tool"], description=TOOL_DOC)
    q: str | None = Field(None, max_length=FILTER_TEXT_MAX_LENGTH["search"], description=Q_DOC)
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(50, ge=1, le=200)

    def queue_filter(self) -> QueueFilter:
        return queue_filter_of(self)


class RecoveryItemOut(Out):
    id: str
    status: str
    reason: str
    risk: str
    suggested_resolution: str
    failed_action_id: str | None = None
    error: str
    opened_at: datetime


def _user_label(user: Any) -> str | None:
    return user.get_username() if user is not None else None


class ActionBrief(Out):
    id: str
    tool: str
    status: str
    risk: str
    seq: int


class RunBrief(Out):
    id: str
    agent: str
    request: str
    status: str
    error: str


class ItemOut(Out):
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

    @staticmethod
    def resolve_assignee(item: RecoveryItem) -> str | None:
        return _user_label(item.assignee)

    @staticmethod
    def resolve_claimed_by(item: RecoveryItem) -> str | None:
        return _user_label(item.claimed_by)

    @staticmethod
    def resolve_age_s(item: RecoveryItem) -> int:
        return selectors.item_age_seconds(item)


class ItemPageOut(Out):
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


class ItemDetailOut(ItemOut):
    plan: PlanOut
    resume_preview: ResumePreviewOut
    unwinds: list[str]
