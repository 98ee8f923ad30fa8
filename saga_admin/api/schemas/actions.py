"""Request and response schemas of the agent API.

Input schemas are strict: an unknown field is an error (it is almost always a typo in agent
code that would otherwise be silently dropped), and nothing is coerced (``"5"`` is not 5,
``"true"`` is not True). Every string has a length limit. Output schemas are built from the
models with ``from_*`` helpers so the API, the idempotency store and the tests all see the same
JSON.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field

from ledger.models import Action, Checkpoint, Run
from ledger.pagination import MAX_CURSOR_LENGTH
from ledger.rules import REASON_MAX_LENGTH
from ledger.tool_names import TOOL_NAME_MAX_LENGTH, TOOL_NAME_PATTERN, TOOL_NAME_RULE
from recovery.models import AgentCommand, Approval, RecoveryItem

# Free-form JSON the ledger stores as-is (args, snapshots, results, state). Its size and depth are
# bounded by the body limits in saga_admin.api.limits.
JSONValue = Any
JSONObject = dict[str, Any]


def _http_url(value: str) -> str:
    if value:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http(s) URL")
    return value


HttpUrlStr = Annotated[str, Field(max_length=2000), AfterValidator(_http_url)]
ActionId = Annotated[str, Field(min_length=1, max_length=40)]
# The one tool-name rule (ledger.tool_names); the services apply it too, for every other path.
ToolName = Annotated[
    str,
    Field(
        min_length=1,
        max_length=TOOL_NAME_MAX_LENGTH,
        pattern=TOOL_NAME_PATTERN,
        description=f"A tool name: {TOOL_NAME_RULE}.",
    ),
]

RunStatus = Literal["running", "succeeded", "failed", "cancelled", "compensating", "compensated", "closed"]
RecoveryMode = Literal["resume_or_compensate", "resume_only", "compensate_only"]
ErrorLayer = Literal["model", "tool", "workflow"]


class StrictIn(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- Inputs ------------------------------------------------------------------------------------


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
    # Checked by the run_create service (ledger.outbound), not here: http(s) and a public or
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


class RunCompleteIn(StrictIn):
    summary: str = Field("", max_length=20000)


class RunFailIn(StrictIn):
    error: str = Field(min_length=1, max_length=20000)
    failed_action_id: ActionId | None = None
    reason: str = Field(
        "failed", max_length=64, description="Recovery reason; unknown values count as 'failed'."
    )


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


class CheckpointIn(StrictIn):
    name: str = Field(min_length=1, max_length=200)
    state: JSONObject = Field(default_factory=dict)
    completed_action_ids: list[ActionId] = Field(default_factory=list, max_length=1000)
    pending_action_ids: list[ActionId] = Field(default_factory=list, max_length=1000)
    requires_user_approval: bool = False
    recovery_mode: RecoveryMode = "resume_or_compensate"
    recovery_instructions: str = Field("", max_length=20000)
    summary: str = Field("", max_length=20000)
    trace_links: list[JSONValue] = Field(default_factory=list, max_length=100)


class PageQuery(Schema):
    cursor: str | None = Field(None, max_length=MAX_CURSOR_LENGTH)
    limit: int = Field(50, ge=1, le=200)


class ActionPageQuery(Schema):
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(100, ge=1, le=500)


# --- Outputs -----------------------------------------------------------------------------------


class WarningOut(Schema):
    code: str
    message: str
    action_id: str | None = None
    pivot_action_id: str | None = None


class GrantOut(Schema):
    by: str
    reason: str
    at: datetime


class ApprovalSummaryOut(Schema):
    id: str
    status: Literal["pending", "approved", "rejected", "expired"]
    risk: str
    expires_at: datetime
    decided_at: datetime | None = None
    reason: str = ""
    args_hash: str
    approved_args: JSONValue = None
    approved_args_hash: str = ""
    edited: bool = Field(False, description="The approver changed the args; the action now carries them.")
    approvers_required: int = Field(1, description="How many distinct people must grant it.")
    grants: list[GrantOut] = Field(
        default_factory=list, description="Grants so far (an approval needing several people stays pending)."
    )


class CompensationOut(Schema):
    strategy: str
    tool: str
    args: JSONValue = None


class ViaOut(Schema):
    gateway: str
    upstream: str


class ActionOut(Schema):
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


class RecoveryItemOut(Schema):
    id: str
    status: str
    reason: str
    risk: str
    suggested_resolution: str
    failed_action_id: str | None = None
    error: str
    opened_at: datetime


class UnwindRefOut(Schema):
    id: str
    status: str
    automatic: bool


class CheckpointOut(Schema):
    id: str
    run_id: str
    name: str
    state: JSONObject
    completed_action_ids: list[str]
    pending_action_ids: list[str]
    requires_user_approval: bool
    recovery_mode: str
    recovery_instructions: str
    summary: str
    trace_links: list[JSONValue]
    created_at: datetime


class RunOut(Schema):
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


class RunPageOut(Schema):
    items: list[RunOut]
    next_cursor: str | None = Field(
        None, description="Pass as ?cursor= for the next page; null on the last one."
    )


class ActionPageOut(Schema):
    items: list[ActionOut]
    next_cursor: str | None = Field(
        None, description="Pass as ?cursor= for the next page; null on the last one."
    )


class CheckpointPageOut(Schema):
    items: list[CheckpointOut]
    next_cursor: str | None = None


class AgentCommandOut(Schema):
    id: str
    run_id: str
    kind: Literal["resume", "cancel"]
    status: Literal["pending", "acked", "cancelled"]
    reason: str
    checkpoint: CheckpointOut | None = None
    created_at: datetime
    acked_at: datetime | None = None
    # Withdrawn before the agent acknowledged it (the run ended, was cancelled or failed again).
    cancelled_at: datetime | None = None
    # Pushes to the run's resume_url: when one got through, how many were tried, and why the last
    # one failed ("Refused: …" when the URL may not be reached; then it is not tried again).
    delivered_at: datetime | None = None
    delivery_attempts: int = 0
    delivery_error: str = ""


class AgentCommandsOut(Schema):
    commands: list[AgentCommandOut]


class HeartbeatOut(Schema):
    run_id: str
    status: RunStatus
    last_heartbeat_at: datetime | None = None
    commands: list[AgentCommandOut]


class ActionVerifyOut(ActionOut):
    recovery_item: RecoveryItemOut | None = None


class ToolPolicyOut(Schema):
    tool: str
    risk: str
    approval: str
    action_class: str
    compensation: str
    compensation_tool: str
    compensation_args: JSONValue = Field(
        None, description="Templates for the compensating tool's args ($args.<path>, $result.<path>, …)."
    )
    approvers: int = Field(1, description="How many distinct people must grant an approval it asks for.")
    rules: list[JSONObject] = Field(
        default_factory=list, description="Rules on the call's args, first match wins."
    )
    limits: list[JSONObject] = Field(
        default_factory=list, description="Count and sum limits over a sliding window."
    )
    scope: Literal["tenant", "global"]
    source: str


class PoliciesOut(Schema):
    policies: list[ToolPolicyOut]
    default_policy: JSONObject
    unwind: JSONObject
    auto_compensate: JSONObject
    source: str


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


class ReviewerOut(Schema):
    who: str
    actor_type: str
    role: str
    decision: str
    subject: str = ""
    reason: str = ""
    at: datetime | None = None


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


# --- Model → output -------------------------------------------------------------------------


def run_out(run: Run) -> dict[str, Any]:
    return RunOut.model_validate(
        {**_fields(run, RunOut), "failed_action_id": run.failed_action_id}
    ).model_dump(mode="json")


def action_out(action: Action, *, approval: Approval | None = None) -> dict[str, Any]:
    compensation = None
    if action.compensation_tool or action.compensation_strategy != "none":
        compensation = {
            "strategy": action.compensation_strategy,
            "tool": action.compensation_tool,
            "args": action.compensation_args,
        }
    approval_data = None
    if approval is not None:
        approval_data = {
            "id": approval.pk,
            "status": approval.status,
            "risk": approval.risk,
            "expires_at": approval.expires_at,
            "decided_at": approval.decided_at,
            "reason": approval.reason,
            "args_hash": approval.args_hash,
            "approved_args": approval.approved_args,
            "approved_args_hash": approval.approved_args_hash,
            "edited": bool(approval.approved_args_hash) and approval.approved_args_hash != approval.args_hash,
            "approvers_required": approval.approvers_required,
            "grants": grants_out(approval),
        }
    data = {
        **_fields(action, ActionOut),
        "run_id": action.run_id,
        "approval": approval_data,
        "compensation": compensation,
    }
    out = ActionOut.model_validate(data).model_dump(mode="json", exclude=set(_AGENT_JSON))
    # The agent's own JSON is handed on as it is: it is JSON already (parsed from a request, or read
    # from a jsonb column), and converting it for JSON would walk every value of up to a megabyte.
    return {name: data.get(name) if name in _AGENT_JSON else out[name] for name in ActionOut.model_fields}


# The fields of an action that hold an agent's free-form JSON (see ``action_out``).
_AGENT_JSON = frozenset({"args", "before_snapshot", "after_snapshot", "result"})


def grants_out(approval: Approval) -> list[dict[str, Any]]:
    """The grants of an approval that needs several people (none read for one that needs one)."""
    if approval.approvers_required <= 1:
        return []
    return [
        {"by": grant.label or grant.approver, "reason": grant.reason, "at": grant.created_at}
        for grant in approval.grants.all()
    ]


def checkpoint_out(checkpoint: Checkpoint) -> dict[str, Any]:
    return CheckpointOut.model_validate(
        {**_fields(checkpoint, CheckpointOut), "run_id": checkpoint.run_id}
    ).model_dump(mode="json")


def recovery_item_out(item: RecoveryItem | None) -> dict[str, Any] | None:
    if item is None:
        return None
    return RecoveryItemOut.model_validate(
        {**_fields(item, RecoveryItemOut), "failed_action_id": item.failed_action_id}
    ).model_dump(mode="json")


def command_out(command: AgentCommand) -> dict[str, Any]:
    return AgentCommandOut.model_validate(
        {
            **_fields(command, AgentCommandOut),
            "run_id": command.run_id,
            "checkpoint": checkpoint_out(command.checkpoint) if command.checkpoint is not None else None,
        }
    ).model_dump(mode="json")


def _fields(obj: Any, schema: type[Schema]) -> dict[str, Any]:
    """The model attributes a schema names (relations and computed fields are added by callers)."""
    return {
        name: getattr(obj, name)
        for name in schema.model_fields
        if hasattr(type(obj), name) or name in vars(obj)
    }
