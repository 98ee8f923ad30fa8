"""The native layout of a policy file (API.md, "Policies and compensators") as pydantic models:
every field's type and check, and the coherence of each entry. Strict: exact lower-case enum
values, no unknown keys, "5" is not 5, so a typo in the file cannot quietly turn into "the
default applies". A policy's ``rules`` and ``limits`` are checked by
``ledger.policies.rule_checks``, whose messages name the exact place."""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ledger.models import ActionClass, ApprovalMode, CompensationStrategy, Compensator, Risk
from ledger.policies.compensation_args import before_args_problems, compensation_args_problems
from ledger.policies.deadlines import deadline_problem, escalate_to_value, on_timeout_value, timeout_seconds
from ledger.policies.rule_checks import approvers_need_manual
from ledger.policies.rules import MAX_APPROVERS
from ledger.tool_names import TOOL_NAME_MAX_LENGTH, glob_problem, is_tool_glob, is_tool_name

ON_FAILURE_VALUES = ("alert_and_continue", "halt")


# --- Field types -----------------------------------------------------------------------------


def _choice(values: list[str]) -> Any:
    """A string that must be one of ``values``; the agentSafety layout has already lower-cased it."""

    def check(value: str) -> str:
        if value not in values:
            raise PydanticCustomError("choice", "must be one of {allowed}", {"allowed": ", ".join(values)})
        return value

    return AfterValidator(check)


RiskValue = Annotated[str, _choice(list(Risk.values))]
ApprovalValue = Annotated[str, _choice(list(ApprovalMode.values))]
ActionClassValue = Annotated[str, _choice(list(ActionClass.values))]
CompensationValue = Annotated[str, _choice(list(CompensationStrategy.values))]
OnFailureValue = Annotated[str, _choice(list(ON_FAILURE_VALUES))]

# Tool names are dotted identifiers ("crm.update_contact", "github/repos.delete"), by the one rule
# of ledger.tool_names; globs add fnmatch's *, ? and [...] classes.
_DOTTED_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def _check_tool_pattern(value: str) -> str:
    if not value:
        raise PydanticCustomError("tool", "must not be empty")
    if len(value) > TOOL_NAME_MAX_LENGTH:
        raise PydanticCustomError("tool", "must be at most {max} characters", {"max": TOOL_NAME_MAX_LENGTH})
    if not is_tool_glob(value):
        raise PydanticCustomError(
            "tool",
            "may contain only letters, digits, and . _ - : / (plus * ? [ ] ! in a glob), got {value}",
            # repr: a control character in the name is shown escaped, not printed into the message.
            {"value": repr(value)},
        )
    depth = 0
    for ch in value:
        depth += ch == "["
        depth -= ch == "]"
        if depth not in (0, 1):
            raise PydanticCustomError("tool", "has unbalanced [ ] in glob '{value}'", {"value": value})
    if depth != 0:
        raise PydanticCustomError("tool", "has unbalanced [ ] in glob '{value}'", {"value": value})
    # The one check of a glob's classes (a backwards range, a class no tool name can meet).
    if problem := glob_problem(value):
        raise PydanticCustomError("tool", "{problem}", {"problem": problem})
    # A pattern with no literal part matches every tool: that is what default_policy is for, and
    # a catch-all glob would silently outrank it for every unknown tool.
    if not re.sub(r"\[[^\]]*\]|[*?]", "", value).strip("._-:/"):
        raise PydanticCustomError(
            "tool", "'{value}' matches every tool; use default_policy for the catch-all", {"value": value}
        )
    return value


def _check_exact_tool(value: str) -> str:
    _check_tool_pattern(value)
    if not is_tool_name(value):
        raise PydanticCustomError(
            "tool", "must be one exact tool name, not a glob '{value}'", {"value": value}
        )
    return value


ToolPattern = Annotated[str, AfterValidator(_check_tool_pattern)]
ExactTool = Annotated[str, AfterValidator(_check_exact_tool)]


def _check_dotted_path(value: str) -> str:
    if not _DOTTED_PATH.match(value):
        raise PydanticCustomError(
            "dotted_path",
            "must be a dotted Python path such as package.module.function, got '{value}'",
            {"value": value},
        )
    return value


DottedPath = Annotated[str, AfterValidator(_check_dotted_path)]


def _check_http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PydanticCustomError(
            "url", "must be an http(s) URL with a host, got '{value}'", {"value": value}
        )
    if len(value) > 2000:
        raise PydanticCustomError("url", "must be at most 2000 characters")
    return value


HttpUrl = Annotated[str, AfterValidator(_check_http_url)]


def _check_env_name(value: str) -> str:
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
        raise PydanticCustomError(
            "env", "must be an environment variable name, got '{value}'", {"value": value}
        )
    return value


EnvName = Annotated[str, AfterValidator(_check_env_name)]

# An HTTP header name is an RFC 9110 token.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}$")
# Headers the MCP transport sets itself: a policy file that set them would break the protocol or
# smuggle a second request, so they are refused by name.
_TRANSPORT_HEADERS = frozenset(
    {
        "accept",
        "connection",
        "content-length",
        "content-type",
        "host",
        "mcp-protocol-version",
        "mcp-session-id",
        "last-event-id",
        "te",
        "transfer-encoding",
        "upgrade",
    }
)


def _check_header_name(value: str) -> str:
    if not _HEADER_NAME.match(value):
        raise PydanticCustomError("header", "must be an HTTP header name, got '{value}'", {"value": value})
    if value.lower() in _TRANSPORT_HEADERS:
        raise PydanticCustomError(
            "header",
            "'{value}' is set by the MCP transport itself and cannot be configured",
            {"value": value},
        )
    return value


HeaderName = Annotated[str, AfterValidator(_check_header_name)]


def _check_mcp_tool_name(value: str) -> str:
    # MCP tool names (spec 2025-11-25, "Tool names"): 1-128 characters of A-Z a-z 0-9 _ - . /
    # fullmatch, not match with "$": "$" also matches before a trailing newline.
    if not re.fullmatch(r"[A-Za-z0-9_\-./]{1,128}", value):
        raise PydanticCustomError(
            "mcp_tool",
            "must be an MCP tool name (1-128 letters, digits, _ - . /), got '{value}'",
            {"value": value},
        )
    return value


McpToolName = Annotated[str, AfterValidator(_check_mcp_tool_name)]


def _check_seconds(value: Any) -> int | float:
    # One check instead of an int | float union, whose errors would be reported once per branch.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError(
            "seconds", "must be a number of seconds, e.g. 30, got '{value}'", {"value": value}
        )
    if not 0 < value <= 24 * 3600:
        raise PydanticCustomError(
            "seconds", "must be more than 0 and at most 86400 seconds, got {value}", {"value": value}
        )
    return value


PositiveSeconds = Annotated[Any, AfterValidator(_check_seconds)]

# Approval deadlines (ledger.policies.deadlines): checked from Any, so a number, a list or a
# boolean gets the field's own message rather than pydantic's per-type ones.
ApprovalTimeout = Annotated[Any, AfterValidator(timeout_seconds)]
OnTimeout = Annotated[Any, AfterValidator(on_timeout_value)]
EscalateTo = Annotated[Any, AfterValidator(escalate_to_value)]


# --- The native layout -----------------------------------------------------------------------


class _Strict(BaseModel):
    # Strict: "5" is not 5 and an unknown key is an error, so a typo in the file cannot quietly
    # turn into "the default applies".
    model_config = ConfigDict(extra="forbid", strict=True)


def _check_compensation_args(value: Any) -> Any:
    if not isinstance(value, dict | str):
        raise PydanticCustomError(
            "compensation_args", 'must be an object (or one template string such as "$args")'
        )
    return value


# Templates for the compensating tool's args (ledger.policies.compensation_args).
CompensationArgs = Annotated[Any, AfterValidator(_check_compensation_args)]


# A dotted path into a read's result ("contact", "item.price", "lines.0"): member names and list
# indexes, no empty segment.
_IMAGE_PATH = re.compile(r"^[^.\s$]+(\.[^.\s$]+)*$")


def _check_image_path(value: str) -> str:
    if len(value) > 500 or not _IMAGE_PATH.match(value):
        raise PydanticCustomError(
            "path",
            "must be a dotted path into the read's result such as contact or item.price, got '{value}'",
            {"value": value},
        )
    return value


ImagePath = Annotated[str, AfterValidator(_check_image_path)]


class BeforeIn(BaseModel):
    """A policy's ``before``: the read that takes an update's before- and after-image."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tool: ExactTool
    args: dict[str, Any] = Field(default_factory=dict)
    path: ImagePath | None = None

    @model_validator(mode="after")
    def _args_fillable(self) -> BeforeIn:
        if problems := before_args_problems(self.args):
            raise PydanticCustomError("before", "{problems}", {"problems": "; ".join(problems)})
        return self


def _deadline_coherent(policy: DefaultPolicyIn | PolicyIn, approvers: int | None) -> None:
    if problem := deadline_problem(
        on_timeout=policy.on_timeout, escalate_to=policy.escalate_to, approvers=approvers
    ):
        raise PydanticCustomError("policy", "{problem}", {"problem": problem})


def _compensation_args_coherent(policy: DefaultPolicyIn | PolicyIn) -> None:
    if policy.compensation_args is None:
        return
    if not policy.compensation_tool:
        raise PydanticCustomError(
            "policy", "compensation_args: needs compensation_tool (the tool these args are for)"
        )
    if policy.compensation == CompensationStrategy.SNAPSHOT:
        raise PydanticCustomError(
            "policy", "compensation_args: a snapshot restore is sent the before_snapshot, not templated args"
        )
    problems = compensation_args_problems(policy.compensation_args)
    if problems:
        # Each problem names its key ("compensation_args.email: …").
        raise PydanticCustomError("policy", "{problems}", {"problems": "; ".join(problems)})


class DefaultPolicyIn(_Strict):
    risk: RiskValue | None = None
    approval: ApprovalValue | None = None
    action_class: ActionClassValue | None = None
    compensation: CompensationValue | None = None
    compensation_tool: ExactTool | None = None
    compensation_args: CompensationArgs | None = None
    # Seconds once validated (written as a duration: "2h").
    approval_timeout: ApprovalTimeout | None = None
    on_timeout: OnTimeout | None = None
    escalate_to: EscalateTo | None = None

    @model_validator(mode="after")
    def _coherent(self) -> DefaultPolicyIn:
        _compensation_args_coherent(self)
        _deadline_coherent(self, None)
        return self


class PolicyIn(_Strict):
    tool: ToolPattern
    risk: RiskValue
    approval: ApprovalValue
    action_class: ActionClassValue
    compensation: CompensationValue | None = None
    compensation_tool: ExactTool | None = None
    compensation_args: CompensationArgs | None = None
    approvers: Annotated[int, Field(ge=1, le=MAX_APPROVERS)] | None = None
    # Seconds once validated (written as a duration: "2h"); None: SAGA_APPROVAL_EXPIRY_H.
    approval_timeout: ApprovalTimeout | None = None
    on_timeout: OnTimeout | None = None
    escalate_to: EscalateTo | None = None
    # Validated by ledger.policies.rule_checks (policy_file_parse), whose messages name the exact place
    # ("rules[1].if.gt: expected a number") and list every problem at once.
    rules: Any = None
    limits: Any = None
    # The read that takes the before- and after-image (ledger.policies.before_images).
    before: BeforeIn | None = None

    @model_validator(mode="after")
    def _coherent(self) -> PolicyIn:
        if problem := approvers_need_manual(approval=self.approval, approvers=self.approvers):
            raise PydanticCustomError("policy", "approvers: {problem}", {"problem": problem})
        if self.action_class == ActionClass.READ_ONLY and self.compensation not in (
            None,
            CompensationStrategy.NONE,
        ):
            raise PydanticCustomError(
                "policy", "compensation: a read_only tool changes nothing, so its compensation must be none"
            )
        if (
            self.action_class == ActionClass.EXTERNAL_IRREVERSIBLE
            and self.compensation == CompensationStrategy.SNAPSHOT
        ):
            raise PydanticCustomError(
                "policy",
                "compensation: snapshot cannot undo an external_irreversible action; use correction or none",
            )
        if self.compensation == CompensationStrategy.NONE and self.compensation_tool:
            raise PydanticCustomError("policy", "compensation_tool: makes no sense with compensation none")
        if self.before is not None and self.action_class == ActionClass.READ_ONLY:
            raise PydanticCustomError(
                "policy", "before: a read_only tool changes nothing, so it has no before-image to take"
            )
        if self.before is not None and self.before.tool == self.tool:
            raise PydanticCustomError("policy", "before.tool: must be a read, not the tool itself")
        _compensation_args_coherent(self)
        _deadline_coherent(self, self.approvers)
        return self

    def effective_compensation(self) -> str:
        if self.compensation is not None:
            return self.compensation
        # Unset: nothing to undo for a read-only tool; otherwise the agent (or compensation_tool)
        # names the compensating tool when it records the action.
        return (
            CompensationStrategy.NONE
            if self.action_class == ActionClass.READ_ONLY
            else CompensationStrategy.CUSTOM
        )


class _CallTargetIn(_Strict):
    """What a policy file's compensator or reader calls: exactly one of a signed webhook, a Python
    callable or an MCP tool. ``_noun`` names it in the messages ("compensator", "reader")."""

    _noun: ClassVar[str] = "target"

    webhook: HttpUrl | None = None
    secret: str | None = Field(default=None, min_length=16, max_length=500)
    secret_env: EnvName | None = None
    python: DottedPath | None = None
    # An MCP tool: the server's Streamable HTTP URL, the tool to call there, and the headers to
    # send, each taken from an environment variable (never written in the file).
    mcp: HttpUrl | None = None
    tool: McpToolName | None = None
    headers_env: dict[HeaderName, EnvName] | None = Field(default=None, max_length=20)

    @model_validator(mode="after")
    def _one_target(self) -> _CallTargetIn:
        noun = self._noun
        if sum(kind is not None for kind in (self.webhook, self.python, self.mcp)) != 1:
            raise PydanticCustomError(noun, "must have exactly one of webhook, python or mcp")
        if self.webhook is not None and (self.secret is None) == (self.secret_env is None):
            raise PydanticCustomError(
                noun, "a webhook needs exactly one of secret or secret_env (to sign its requests)"
            )
        if self.webhook is None and (self.secret is not None or self.secret_env is not None):
            raise PydanticCustomError(noun, "secret and secret_env apply to webhooks only")
        if self.mcp is not None and self.tool is None:
            raise PydanticCustomError(
                noun, 'an mcp {noun} needs the tool to call on that server ("tool": "name")', {"noun": noun}
            )
        if self.mcp is None and (self.tool is not None or self.headers_env is not None):
            raise PydanticCustomError(noun, "tool and headers_env apply to mcp {noun}s only", {"noun": noun})
        if self.headers_env is not None:
            lowered = [name.lower() for name in self.headers_env]
            if len(set(lowered)) != len(lowered):
                raise PydanticCustomError(noun, "headers_env names a header twice (header names ignore case)")
        return self

    @property
    def kind(self) -> str:
        if self.webhook is not None:
            return Compensator.Kind.WEBHOOK
        if self.mcp is not None:
            return Compensator.Kind.MCP
        return Compensator.Kind.PYTHON


class CompensatorIn(_CallTargetIn):
    _noun: ClassVar[str] = "compensator"

    # Optional reader that returns the target's current state, for snapshot drift checks.
    reader: DottedPath | None = None


class ReaderIn(_CallTargetIn):
    """How the worker reads a ``before`` tool (the file's ``readers``)."""

    _noun: ClassVar[str] = "reader"


class UnwindIn(_Strict):
    on_compensation_failure: OnFailureValue | None = None
    step_timeout_s: PositiveSeconds | None = None
    max_attempts: Annotated[int, Field(ge=1, le=100)] | None = None


class AutoCompensateIn(_Strict):
    # None (null): never compensate automatically.
    max_risk: RiskValue | None = None


class PolicyFileIn(_Strict):
    default_policy: DefaultPolicyIn | None = None
    policies: list[PolicyIn] = Field(default_factory=list)
    compensators: dict[ExactTool, CompensatorIn] = Field(default_factory=dict)
    readers: dict[ExactTool, ReaderIn] = Field(default_factory=dict)
    unwind: UnwindIn | None = None
    auto_compensate: AutoCompensateIn | None = None
    audit: dict[str, Any] | None = None

    @field_validator("policies")
    @classmethod
    def _unique_tools(cls, policies: list[PolicyIn]) -> list[PolicyIn]:
        seen: dict[str, int] = {}
        for index, policy in enumerate(policies):
            if policy.tool in seen:
                raise PydanticCustomError(
                    "duplicate",
                    'policies[{index}] (tool "{tool}"): duplicates policies[{first}]; each pattern may appear once',
                    {"index": index, "tool": policy.tool, "first": seen[policy.tool]},
                )
            seen[policy.tool] = index
        return policies
