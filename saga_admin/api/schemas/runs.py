"""Runs: what an agent sends to start, list, report on and heartbeat a run, what it gets back
(the run, its detail, its trail), and what an operator's cancel answers."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Schema
from pydantic import Field

from infra.pagination import MAX_CURSOR_LENGTH
from saga_admin.api.schemas.actions import ActionOut
from saga_admin.api.schemas.checkpoints import CheckpointOut
from saga_admin.api.schemas.commands import CommandOut
from saga_admin.api.schemas.common import ActionId, HttpUrlStr, JSONObject, Out, StrictIn
from saga_admin.api.schemas.queue import RecoveryItemOut

RunStatus = Literal["running", "succeeded", "failed", "cancelled", "compensating", "compensated", "closed"]


class RunIn(StrictIn):
    agent: str = Field(
        min_length=1, max_length=200, description="The agent (workflow) name, e.g. 'onboarding'."
    )
    request: str = Field(min_length=1, max_length=20000, description="The user's request, verbatim.")
    external_id: str = Field(
        "", max_length=200, description="Your own id for this run (ticket, job, thread)."
    )
    user_id: str = Field("", max_length=200)
    goal: str = Field("", max_length=5000)
    trace_url: HttpUrlStr = ""
    # Checked by the run_create service (infra.outbound), not here: http(s) and a public or
    # operator-allowed host, else 422 url_not_allowed.
    resume_url: str = Field(
        "",
        max_length=2000,
        description="Webhook that receives signed resume/cancel commands: an http(s) URL whose host is "
        "public or allowed by SAGA_OUTBOUND_ALLOWED_HOSTS (else 422 url_not_allowed).",
    )
    metadata: JSONObject = Field(default_factory=dict)


class RunListQuery(Schema):
    # Query strings are text by nature, so this one is not strict (limit=5 arrives as "5").
    status: RunStatus | None = None
    agent: str | None = Field(None, max_length=200)
    external_id: str | None = Field(None, max_length=200)
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(50, ge=1, le=200)


class HeartbeatIn(StrictIn):
    note: str = Field("", max_length=2000)


_WITHDRAW_APPROVALS = (
    "Withdraw the approvals the run's actions still wait for (each action is rejected): without "
    "it, a run with an action awaiting approval is refused with 409 pending_approvals."
)


class RunCompleteIn(StrictIn):
    summary: str = Field("", max_length=20000)
    withdraw_approvals: bool = Field(False, description=_WITHDRAW_APPROVALS)


class RunFailIn(StrictIn):
    error: str = Field(min_length=1, max_length=20000)
    failed_action_id: ActionId | None = None
    reason: str = Field(
        "failed", max_length=64, description="Recovery reason; unknown values count as 'failed'."
    )
    withdraw_approvals: bool = Field(False, description=_WITHDRAW_APPROVALS)


class WarningOut(Out):
    code: str
    message: str
    action_id: str | None = None
    pivot_action_id: str | None = None


class UnwindRefOut(Schema):
    id: str
    status: str
    automatic: bool


class RunOut(Out):
    id: str
    agent: str
    request: str
    external_id: str
    user_id: str
    goal: str
    trace_url: str
    resume_url: str
    metadata: JSONObject
    status: RunStatus
    summary: str
    error: str
    failure_reason: str
    failed_action_id: str | None = None
    action_count: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    last_heartbeat_at: datetime | None = None


class RunDetailOut(RunOut):
    actions: list[ActionOut] = Field(description="The run's newest actions (at most 100), in `seq` order.")
    actions_next: str | None = Field(
        None,
        description="When the run has more actions than shown: the path of the first page of "
        "`GET /runs/{id}/actions` (every action, oldest first); null when all are shown.",
    )
    latest_checkpoint: CheckpointOut | None = None
    recovery_item: RecoveryItemOut | None = Field(
        None, description="The run's unresolved recovery item, if any."
    )
    warnings: list[WarningOut]


class RunFailOut(RunOut):
    recovery_item: RecoveryItemOut | None = None
    unwind: UnwindRefOut | None = Field(
        None, description="Set when policy compensated the failure automatically."
    )


class RunPageOut(Out):
    items: list[RunOut]
    next_cursor: str | None = Field(
        None, description="Pass as ?cursor= for the next page; null on the last one."
    )


class HeartbeatOut(Schema):
    run_id: str
    status: RunStatus
    last_heartbeat_at: datetime | None = None
    commands: list[CommandOut]


class TrailEntryOut(Schema):
    action_id: str
    seq: int
    tool: str
    target_type: str
    target_id: str
    action_class: str
    status: str
    at: datetime | None = None
    description: str
    how: str = ""
    reason: str = ""
    # On ``restored`` entries only: whether the action's reader read the before-image back after
    # the undo (false without a reader: undone as the compensator said, not proven).
    verified: bool | None = None


class ReviewerOut(Schema):
    who: str
    actor_type: str
    role: str
    decision: str
    subject: str = ""
    reason: str = ""
    at: datetime | None = None
    bulk_id: str = Field(
        "", description="The bulk decision by filter this decision was part of (empty: none)."
    )


class TrailOut(Schema):
    run_id: str
    status: RunStatus
    changed: list[TrailEntryOut]
    restored: list[TrailEntryOut]
    not_undone: list[TrailEntryOut]
    to_undo: list[TrailEntryOut] = Field(
        default_factory=list,
        description="Actions an unwind in progress has still ahead of it (queued, running or awaiting approval).",
    )
    kept: list[TrailEntryOut] = Field(
        description="Actions a partial compensation left as they are, because the operator chose to keep them."
    )
    reviewed_by: list[ReviewerOut]
    summary: str
    audit_url: str


class RunCancelOut(RunOut):
    command: CommandOut = Field(description="The cancel command the agent is given.")
    unknown_action_ids: list[str] = Field(
        description="The actions that were running: their outcome is now unknown (reconcile them)."
    )
    recovery_item: RecoveryItemOut | None = Field(
        None, description="The run's item (reason cancelled) when it changed something; else null."
    )
