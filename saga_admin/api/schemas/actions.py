"""Actions, the ledger's entries: what an agent sends to record one and report on it, and the
action as the API shows it (with its approval, when it needs one)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

from infra.pagination import MAX_CURSOR_LENGTH
from ledger.models import Action
from ledger.rules import REASON_MAX_LENGTH
from recovery import selectors as recovery_selectors
from recovery.models import Approval
from saga_admin.api.schemas.approvals import (
    ESCALATE_TO_DOC,
    ESCALATED_AT_DOC,
    ON_TIMEOUT_DOC,
    ApprovalGrantOut,
    ApprovalShown,
)
from saga_admin.api.schemas.common import JSONObject, JSONValue, Out, StrictIn, ToolName
from saga_admin.api.schemas.queue import RecoveryItemOut

ErrorLayer = Literal["model", "tool", "workflow"]


class CompensationIn(StrictIn):
    tool: ToolName
    args: JSONObject = Field(default_factory=dict)


# One line of printable text: no control characters (PostgreSQL's jsonb refuses NUL, and a page
# or a log line must show what was stored).
PrintableLine = r"^[^\x00-\x1f\x7f]+$"


class ViaIn(StrictIn):
    gateway: str = Field(
        min_length=1,
        max_length=200,
        pattern=PrintableLine,
        description="The gateway that forwards the call (saga-mcp sends `saga-mcp/<version>`).",
    )
    upstream: str = Field(
        min_length=1,
        max_length=2000,
        pattern=PrintableLine,
        description="The upstream that performs it: an MCP server's Streamable HTTP URL, or the command "
        "the gateway starts over stdio. Compared, never called: an undo must reach this upstream.",
    )


class IntentIn(Schema):
    # Agents add their own notes (plan, model, prompt id), so unknown keys are kept; the two the
    # dashboard shows are typed strictly.
    model_config = ConfigDict(extra="allow", strict=True)

    reasoning: str = Field("", max_length=20000)
    confidence: float | None = Field(None, ge=0, le=1)


class ActionIn(StrictIn):
    tool: ToolName
    target_type: str = Field("", max_length=100)
    target_id: str = Field("", max_length=500)
    args: JSONObject = Field(default_factory=dict)
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Required here or as the Idempotency-Key header. Retries of one call reuse it.",
    )
    intent: IntentIn | None = Field(None, description="Why the agent does this, as it knew it then.")
    before_snapshot: JSONValue = None
    compensation: CompensationIn | None = None
    via: ViaIn | None = Field(
        None,
        description="Recorded through a gateway: which gateway forwarded the call and which upstream "
        "performs it. Part of the idempotency fingerprint. A compensation step whose compensator does "
        "not reach that upstream (an MCP compensator on the same URL) waits for a person.",
    )
    start: bool = Field(
        False,
        description="Also start it: an action that needs no approval is returned `running` (attempt 1, "
        "as if /start had been called); one that needs approval is returned `awaiting_approval` as "
        "usual. Not part of the idempotency fingerprint: a replay returns the action as it is now.",
    )


class ActionSucceedIn(StrictIn):
    result: JSONValue = None
    after_snapshot: JSONValue = None


class ActionFailIn(StrictIn):
    error: str = Field(min_length=1, max_length=20000)
    retryable: bool
    layer: ErrorLayer
    outcome_unknown: bool = Field(False, description="The call timed out and may have happened.")


class ActionVerifyIn(StrictIn):
    ok: bool
    expected: JSONValue = None
    actual: JSONValue = None
    reason: str = Field("", max_length=REASON_MAX_LENGTH)


class ActionReconcileIn(StrictIn):
    happened: bool = Field(description="True: the timed-out call did take effect; False: it did not.")
    reason: str = Field(min_length=1, max_length=REASON_MAX_LENGTH)
    result: JSONValue = None
    after_snapshot: JSONValue = None


class ActionPageQuery(Schema):
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(100, ge=1, le=500)


class ApprovalSummaryOut(ApprovalShown):
    id: str
    status: Literal["pending", "approved", "rejected", "expired"]
    risk: str
    expires_at: datetime
    decided_at: datetime | None = None
    reason: str = Field(
        "", description='The decider\'s reason; "timed_out" for one nobody decided before its deadline.'
    )
    args_hash: str
    approved_args: JSONValue = None
    approved_args_hash: str = ""
    edited: bool = Field(False, description="The approver changed the args; the action now carries them.")
    approvers_required: int = Field(1, description="How many distinct people must grant it.")
    grants: list[ApprovalGrantOut] = Field(
        default_factory=list, description="Grants so far (an approval needing several people stays pending)."
    )
    on_timeout: Literal["reject", "escalate"] = Field("reject", description=ON_TIMEOUT_DOC)
    escalate_to: str | None = Field(None, description=ESCALATE_TO_DOC)
    escalated_at: datetime | None = Field(None, description=ESCALATED_AT_DOC)

    @staticmethod
    def resolve_edited(approval: Approval) -> bool:
        return bool(approval.approved_args_hash) and approval.approved_args_hash != approval.args_hash


# An action's compensation, read from the action's ``compensation_*`` fields (a comment, not a
# docstring: a schema's docstring would become its description in the OpenAPI document).
class CompensationOut(Out):
    strategy: str
    tool: str
    args: JSONValue = None

    @staticmethod
    def resolve_strategy(action: Action) -> str:
        return action.compensation_strategy

    @staticmethod
    def resolve_tool(action: Action) -> str:
        return action.compensation_tool

    @staticmethod
    def resolve_args(action: Action) -> Any:
        return action.compensation_args


class ViaOut(Out):
    gateway: str
    upstream: str


# The approval an action shows is not one of its attributes: the caller reads it (the newest of the
# action's, ``recovery.selectors.latest_action_approvals``) and hands it on in the validation's
# context under this key (``action_shown``).
APPROVAL = "approval"


class ActionOut(Out):
    # The agent's free-form JSON (up to a megabyte each), handed on as it is (``Out.json_ready``).
    AS_IS: ClassVar[frozenset[str]] = frozenset({"args", "before_snapshot", "after_snapshot", "result"})

    id: str
    run_id: str
    seq: int
    tool: str
    target_type: str
    target_id: str
    args: JSONValue
    idempotency_key: str
    status: str
    risk: str
    action_class: str
    requires_approval: bool
    approval: ApprovalSummaryOut | None = None
    policy: JSONObject
    compensation: CompensationOut | None = None
    via: ViaOut | None = Field(
        None, description="The gateway and upstream the call went through (null: none)."
    )
    intent: JSONObject
    before_snapshot: JSONValue = None
    after_snapshot: JSONValue = None
    result: JSONValue = None
    attempts: int
    error: str
    error_layer: str
    retryable: bool | None = None
    verified: bool | None = None
    verification: JSONValue = None
    warnings: list[JSONObject]
    completion_seq: int | None = None
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None

    @staticmethod
    def resolve_approval(action: Action, context: Any) -> Approval | None:
        return context.get(APPROVAL) if isinstance(context, dict) else None

    @staticmethod
    def resolve_compensation(action: Action) -> Action | None:
        has_compensation = action.compensation_tool or action.compensation_strategy != "none"
        return action if has_compensation else None


class ActionPageOut(Out):
    items: list[ActionOut]
    next_cursor: str | None = Field(
        None, description="Pass as ?cursor= for the next page; null on the last one."
    )


class ActionVerifyOut(ActionOut):
    recovery_item: RecoveryItemOut | None = None


def action_shown(action: Action, approval: Approval | None = None) -> ActionOut:
    """The action as the API shows it, with ``approval``: the newest of the action's, which the
    caller read (only an action that requires approval has one)."""
    return ActionOut.model_validate(action, context={APPROVAL: approval})


def actions_shown(actions: list[Action], approvals: dict[str, Approval]) -> list[ActionOut]:
    """Actions as the API shows them, each with its approval in ``approvals`` (by action id)."""
    return [action_shown(action, approvals.get(action.pk)) for action in actions]


def approvals_shown(run_id: str, actions: list[Action]) -> dict[str, Approval]:
    """The approvals ``actions`` show (the newest of each, by action id), in one query for all."""
    gated = [action.pk for action in actions if action.requires_approval]
    return recovery_selectors.latest_action_approvals(run_id=run_id, action_ids=gated) if gated else {}
