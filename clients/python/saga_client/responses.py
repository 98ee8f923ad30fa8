"""What Saga Admin's agent API answers, as ``TypedDict``s: the shapes the client's methods return.

The field names are the server's output schemas (``saga_admin/api/schemas/``, described in
docs/API.md); a timestamp is its ISO 8601 text, and a field the server may leave empty is
``None``. They are plain dicts at run time: reading ``run["status"]`` or ``action["result"]`` is
plain dict access, and a type checker knows the keys.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

RunStatus = Literal["running", "succeeded", "failed", "cancelled", "compensating", "compensated", "closed"]


class WarningDict(TypedDict):
    code: str
    message: str
    action_id: str | None
    pivot_action_id: str | None


class GrantDict(TypedDict):
    by: str
    reason: str
    at: str


class ApprovalDict(TypedDict):
    """An action's approval: its decision and the args it was decided on."""

    id: str
    status: Literal["pending", "approved", "rejected", "expired"]
    risk: str
    expires_at: str
    decided_at: str | None
    reason: str
    args_hash: str
    approved_args: Any
    approved_args_hash: str
    edited: bool
    approvers_required: int
    grants: list[GrantDict]


class CompensationDict(TypedDict):
    strategy: str
    tool: str
    args: Any


class ViaDict(TypedDict):
    gateway: str
    upstream: str


class ActionDict(TypedDict):
    """One recorded tool call (``POST /runs/{id}/actions`` and every ``/actions/{id}/…``)."""

    id: str
    run_id: str
    seq: int
    tool: str
    target_type: str
    target_id: str
    args: Any
    idempotency_key: str
    status: str
    risk: str
    action_class: str
    requires_approval: bool
    approval: ApprovalDict | None
    policy: dict[str, Any]
    compensation: CompensationDict | None
    via: ViaDict | None
    intent: dict[str, Any]
    before_snapshot: Any
    after_snapshot: Any
    result: Any
    attempts: int
    error: str
    error_layer: str
    retryable: bool | None
    verified: bool | None
    verification: Any
    warnings: list[dict[str, Any]]
    completion_seq: int | None
    created_at: str
    started_at: str | None
    completed_at: str | None


class PlanDict(TypedDict):
    """A recorded plan (``POST /runs/{id}/plan``): its actions in order, and the pivot lint over
    it (``pivot_order`` warnings naming both actions)."""

    actions: list[ActionDict]
    warnings: list[WarningDict]


class RecoveryItemDict(TypedDict):
    id: str
    status: str
    reason: str
    risk: str
    suggested_resolution: str
    failed_action_id: str | None
    error: str
    opened_at: str


class ActionVerifyDict(ActionDict):
    """``POST /actions/{id}/verify``: the action, and the recovery item a failed check opened."""

    recovery_item: RecoveryItemDict | None


class UnwindRefDict(TypedDict):
    id: str
    status: str
    automatic: bool


class CheckpointDict(TypedDict):
    id: str
    run_id: str
    name: str
    state: dict[str, Any]
    completed_action_ids: list[str]
    pending_action_ids: list[str]
    requires_user_approval: bool
    recovery_mode: str
    recovery_instructions: str
    summary: str
    trace_links: list[Any]
    created_at: str


class RunDict(TypedDict):
    """A run (``POST /runs``, ``/complete``, and each item of ``GET /runs``)."""

    id: str
    agent: str
    request: str
    external_id: str
    user_id: str
    goal: str
    trace_url: str
    resume_url: str
    metadata: dict[str, Any]
    status: RunStatus
    summary: str
    error: str
    failure_reason: str
    failed_action_id: str | None
    action_count: int
    created_at: str
    updated_at: str
    finished_at: str | None
    last_heartbeat_at: str | None


class RunDetailDict(RunDict):
    """``GET /runs/{id}``: the run with its newest actions (``actions_next`` set when it has more)."""

    actions: list[ActionDict]
    actions_next: str | None
    latest_checkpoint: CheckpointDict | None
    recovery_item: RecoveryItemDict | None
    warnings: list[WarningDict]


class RunFailDict(RunDict):
    """``POST /runs/{id}/fail``: the run, the recovery item it opened and the unwind it started."""

    recovery_item: RecoveryItemDict | None
    unwind: UnwindRefDict | None


class RunPageDict(TypedDict):
    items: list[RunDict]
    next_cursor: str | None


class ActionPageDict(TypedDict):
    items: list[ActionDict]
    next_cursor: str | None


class CommandDict(TypedDict):
    """A resume or cancel command for the agent (heartbeat, ``GET /runs/{id}/commands``, ack)."""

    id: str
    run_id: str
    kind: Literal["resume", "cancel"]
    status: Literal["pending", "acked", "cancelled"]
    reason: str
    checkpoint: CheckpointDict | None
    created_at: str
    acked_at: str | None
    cancelled_at: str | None
    delivered_at: str | None
    delivery_attempts: int
    delivery_error: str


class ToolPolicyDict(TypedDict):
    tool: str
    risk: str
    approval: str
    action_class: str
    compensation: str
    compensation_tool: str
    compensation_args: Any
    approvers: int
    rules: list[dict[str, Any]]
    limits: list[dict[str, Any]]
    scope: Literal["tenant", "global"]
    source: str


class PoliciesDict(TypedDict):
    """``GET /policies``: the policies in force for this agent's tenant."""

    policies: list[ToolPolicyDict]
    default_policy: dict[str, Any]
    unwind: dict[str, Any]
    auto_compensate: dict[str, Any]
    source: str


class TrailEntryDict(TypedDict):
    action_id: str
    seq: int
    tool: str
    target_type: str
    target_id: str
    action_class: str
    status: str
    at: str | None
    description: str
    how: str
    reason: str


class ReviewerDict(TypedDict):
    who: str
    actor_type: str
    role: str
    decision: str
    subject: str
    reason: str
    at: str | None


class TrailDict(TypedDict):
    """``GET /runs/{id}/trail``: what the run changed, what was restored, what was not undone."""

    run_id: str
    status: RunStatus
    changed: list[TrailEntryDict]
    restored: list[TrailEntryDict]
    not_undone: list[TrailEntryDict]
    to_undo: list[TrailEntryDict]
    kept: list[TrailEntryDict]
    reviewed_by: list[ReviewerDict]
    summary: str
    audit_url: str


__all__ = [
    "ActionDict",
    "ActionPageDict",
    "ActionVerifyDict",
    "ApprovalDict",
    "CheckpointDict",
    "CommandDict",
    "CompensationDict",
    "GrantDict",
    "PlanDict",
    "PoliciesDict",
    "RecoveryItemDict",
    "ReviewerDict",
    "RunDetailDict",
    "RunDict",
    "RunFailDict",
    "RunPageDict",
    "RunStatus",
    "ToolPolicyDict",
    "TrailDict",
    "TrailEntryDict",
    "UnwindRefDict",
    "ViaDict",
    "WarningDict",
]
