"""Loading a policy file (``manage.py load_policies``): parse, validate, then replace one scope.

Two layouts are accepted. The native one (API.md, "Policies and compensators") is validated
strictly: exact lower-case enum values, no unknown keys. The ``agentSafety`` layout seen in the
wild is translated into the native shape first (camelCase keys, upper-case enum values, durations
such as ``"30s"``) and then goes through the same validation, so both layouts mean the same thing
once loaded.

A load is one transaction: a file with any error changes nothing, and every error names the
entry it is about (``policies[2] (tool "payments.charge"): risk: must be one of …``). Loading the
same file twice changes nothing: rows whose content is already what the file says are not
written at all.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import structlog
from django.db import connection, transaction
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from ledger.audit import Actor, audit_record
from ledger.compensation_risks import unattended_destructive_compensations
from ledger.durations import parse_duration
from ledger.hashing import canonical_json, sha256_hex
from ledger.models import (
    ActionClass,
    ApprovalMode,
    CompensationStrategy,
    Compensator,
    PolicySet,
    Risk,
    Tenant,
    ToolPolicy,
)
from ledger.policies import compensation_args_problems
from ledger.policy_rules import MAX_APPROVERS, approvers_need_manual, limits_problems, rules_problems
from ledger.tool_names import TOOL_NAME_MAX_LENGTH, is_tool_glob, is_tool_name
from ledger.upstreams import policy_upstream_mismatches

logger = structlog.get_logger("ledger.policies")

NATIVE = "native"
AGENT_SAFETY = "agentSafety"

ON_FAILURE_VALUES = ("alert_and_continue", "halt")


class PolicyFileError(Exception):
    """A policy file that cannot be loaded; ``problems`` lists every bad entry, one line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        count = f"{len(problems)} error{'s' if len(problems) != 1 else ''}"
        super().__init__(f"{source}: {count}, nothing was changed:\n" + "\n".join(f"  {p}" for p in problems))


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


# Templates for the compensating tool's args (ledger.policies.compensation_args_fill).
CompensationArgs = Annotated[Any, AfterValidator(_check_compensation_args)]


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

    @model_validator(mode="after")
    def _coherent(self) -> DefaultPolicyIn:
        _compensation_args_coherent(self)
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
    # Validated by ledger.policy_rules (policy_file_parse), whose messages name the exact place
    # ("rules[1].if.gt: expected a number") and list every problem at once.
    rules: Any = None
    limits: Any = None

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
        _compensation_args_coherent(self)
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


class CompensatorIn(_Strict):
    webhook: HttpUrl | None = None
    secret: str | None = Field(default=None, min_length=16, max_length=500)
    secret_env: EnvName | None = None
    python: DottedPath | None = None
    # An MCP compensator: the server's Streamable HTTP URL, the tool to call there, and the
    # headers to send, each taken from an environment variable (never written in the file).
    mcp: HttpUrl | None = None
    tool: McpToolName | None = None
    headers_env: dict[HeaderName, EnvName] | None = Field(default=None, max_length=20)
    reader: DottedPath | None = None

    @model_validator(mode="after")
    def _one_target(self) -> CompensatorIn:
        if sum(kind is not None for kind in (self.webhook, self.python, self.mcp)) != 1:
            raise PydanticCustomError("compensator", "must have exactly one of webhook, python or mcp")
        if self.webhook is not None and (self.secret is None) == (self.secret_env is None):
            raise PydanticCustomError(
                "compensator", "a webhook needs exactly one of secret or secret_env (to sign its requests)"
            )
        if self.webhook is None and (self.secret is not None or self.secret_env is not None):
            raise PydanticCustomError("compensator", "secret and secret_env apply to webhooks only")
        if self.mcp is not None and self.tool is None:
            raise PydanticCustomError(
                "compensator", 'an mcp compensator needs the tool to call on that server ("tool": "name")'
            )
        if self.mcp is None and (self.tool is not None or self.headers_env is not None):
            raise PydanticCustomError("compensator", "tool and headers_env apply to mcp compensators only")
        if self.headers_env is not None:
            lowered = [name.lower() for name in self.headers_env]
            if len(set(lowered)) != len(lowered):
                raise PydanticCustomError(
                    "compensator", "headers_env names a header twice (header names ignore case)"
                )
        return self

    @property
    def kind(self) -> str:
        if self.webhook is not None:
            return Compensator.Kind.WEBHOOK
        if self.mcp is not None:
            return Compensator.Kind.MCP
        return Compensator.Kind.PYTHON


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


# --- The agentSafety layout ------------------------------------------------------------------

# What each agentSafety compensation means in the native vocabulary, and the action class it
# implies when the entry does not say (conservative: "none" means it cannot be undone).
_AGENT_SAFETY_COMPENSATION = {
    "snapshot": (CompensationStrategy.SNAPSHOT, ActionClass.INTERNAL_UPDATE),
    "correction": (CompensationStrategy.CORRECTION, ActionClass.EXTERNAL_IRREVERSIBLE),
    "none": (CompensationStrategy.NONE, ActionClass.EXTERNAL_IRREVERSIBLE),
    "custom": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
    "delete": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
    "cancel": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
    "compensate": (CompensationStrategy.CUSTOM, ActionClass.EXTERNAL_REVERSIBLE),
}


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class _Problems:
    """Problems found while translating agentSafety into the native shape."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


def _translate_agent_safety(root: Any, problems: _Problems) -> dict[str, Any]:
    if not isinstance(root, dict):
        problems.add("agentSafety", "must be an object")
        return {}
    native: dict[str, Any] = {}
    known = {"policies", "unwind", "audit", "compensators", "default_policy", "auto_compensate"}
    for key in root:
        if _snake(key) not in known:
            problems.add(f"agentSafety.{key}", f"unknown key (allowed: {', '.join(sorted(known))})")

    def entry(key: str) -> Any:
        for candidate, value in root.items():
            if _snake(candidate) == key:
                return value
        return None

    policies = entry("policies")
    if policies is not None:
        if not isinstance(policies, dict):
            problems.add("agentSafety.policies", "must be an object mapping tool names to policies")
        else:
            native["policies"] = []
            for tool, raw in policies.items():
                where = f'agentSafety.policies["{tool}"]'
                if not isinstance(raw, dict):
                    problems.add(where, "must be an object")
                    continue
                native["policies"].append(_translate_policy(tool, raw, problems, where))

    default = entry("default_policy")
    if default is not None:
        native["default_policy"] = (
            _translate_policy(None, default, problems, "agentSafety.defaultPolicy")
            if isinstance(default, dict)
            else default
        )

    unwind = entry("unwind")
    if unwind is not None:
        native["unwind"] = _translate_unwind(unwind, problems)

    auto = entry("auto_compensate")
    if auto is not None:
        native["auto_compensate"] = (
            {_snake(k): _lower(v) for k, v in auto.items()} if isinstance(auto, dict) else auto
        )

    compensators = entry("compensators")
    if compensators is not None:
        native["compensators"] = (
            {
                tool: ({_snake(k): v for k, v in spec.items()} if isinstance(spec, dict) else spec)
                for tool, spec in compensators.items()
            }
            if isinstance(compensators, dict)
            else compensators
        )

    audit = entry("audit")
    if audit is not None:
        native["audit"] = audit
    return native


def _translate_policy(
    tool: str | None, raw: dict[str, Any], problems: _Problems, where: str
) -> dict[str, Any]:
    policy: dict[str, Any] = {} if tool is None else {"tool": tool}
    for key, value in raw.items():
        name = _snake(key)
        if name == "rules":
            policy[name] = [_translate_rule(rule) for rule in value] if isinstance(value, list) else value
        elif name == "limits":
            policy[name] = (
                [
                    {
                        _snake(k): (_lower(v) if _snake(k) in ("per", "on_exceed") else v)
                        for k, v in limit.items()
                    }
                    if isinstance(limit, dict)
                    else limit
                    for limit in value
                ]
                if isinstance(value, list)
                else value
            )
        else:
            policy[name] = (
                _lower(value) if name in {"risk", "approval", "action_class", "compensation"} else value
            )
    compensation = policy.get("compensation")
    if isinstance(compensation, str):
        if compensation not in _AGENT_SAFETY_COMPENSATION:
            allowed = ", ".join(name.upper() for name in _AGENT_SAFETY_COMPENSATION)
            problems.add(where, f"compensation: must be one of {allowed}, got {raw.get('compensation')!r}")
            del policy["compensation"]
            return policy
        strategy, implied_class = _AGENT_SAFETY_COMPENSATION[compensation]
        policy["compensation"] = strategy.value
        if tool is not None:
            policy.setdefault("action_class", implied_class.value)
    return policy


def _translate_condition(raw: Any) -> Any:
    """camelCase condition keys (``notIn``) in the native spelling; operands are kept as written."""
    if not isinstance(raw, dict):
        return raw
    condition: dict[str, Any] = {}
    for key, value in raw.items():
        name = _snake(key)
        condition[name] = (
            [_translate_condition(c) for c in value]
            if name in ("all", "any") and isinstance(value, list)
            else value
        )
    return condition


def _translate_rule(raw: Any) -> Any:
    """An agentSafety rule: condition keys as above, ``then`` values case-insensitive."""
    if not isinstance(raw, dict):
        return raw
    rule: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "if":
            rule[key] = _translate_condition(value)
        elif key == "then" and isinstance(value, dict):
            rule[key] = {_snake(k): (_lower(v) if _snake(k) != "approvers" else v) for k, v in value.items()}
        else:
            rule[key] = value
    return rule


def _translate_unwind(raw: Any, problems: _Problems) -> Any:
    if not isinstance(raw, dict):
        return raw
    unwind: dict[str, Any] = {}
    for key, value in raw.items():
        name = _snake(key)
        where = f"agentSafety.unwind.{key}"
        if name == "strategy":
            # Saga Admin always unwinds newest-first; anything else would break guarantee 4.
            if _lower(value) != "lifo":
                problems.add(where, f"must be LIFO (the only order Saga Admin unwinds in), got '{value}'")
        elif name == "on_compensation_failure":
            unwind[name] = _lower(value)
        elif name in ("timeout", "step_timeout", "step_timeout_s"):
            try:
                unwind["step_timeout_s"] = parse_duration(value)
            except ValueError as exc:
                problems.add(where, str(exc))
        else:
            unwind[name] = value
    return unwind


# --- Parsing and error messages --------------------------------------------------------------


@dataclass(frozen=True)
class PolicyDocument:
    """A validated policy file, in the native vocabulary."""

    layout: str
    default_policy: dict[str, Any]
    policies: list[dict[str, Any]]
    compensators: dict[str, dict[str, Any]]
    unwind: dict[str, Any]
    auto_compensate: dict[str, Any]
    audit: dict[str, Any]

    @property
    def content_hash(self) -> str:
        return sha256_hex(
            {
                "default_policy": self.default_policy,
                "policies": self.policies,
                "compensators": self.compensators,
                "unwind": self.unwind,
                "auto_compensate": self.auto_compensate,
                "audit": self.audit,
            }
        )


_FRIENDLY = {
    "missing": "is required",
    "extra_forbidden": "unknown key",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "list_type": "must be a list",
}


def _message(error: ErrorDetails) -> str:
    kind = error["type"]
    if kind in _FRIENDLY:
        return _FRIENDLY[kind]
    if kind == "value_error":
        return str(error["ctx"]["error"])
    ctx = error.get("ctx") or {}
    if kind == "string_too_short":
        return f"must be at least {ctx.get('min_length')} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        symbol = {"greater_than_equal": ">=", "less_than_equal": "<=", "greater_than": ">", "less_than": "<"}[
            kind
        ]
        bound = next(iter(ctx.values()), "")
        return f"must be {symbol} {bound}"
    return str(error["msg"])


def _where(loc: tuple[Any, ...], data: Any, prefix: str) -> tuple[str, list[str]]:
    """Split a pydantic location into the entry it names and the field path within it."""
    if not loc:
        return prefix.rstrip(".") or "file", []
    head, rest = loc[0], list(loc[1:])
    if head == "policies" and rest and isinstance(rest[0], int):
        index = rest.pop(0)
        policies = data.get("policies") if isinstance(data, dict) else None
        tool = (
            policies[index].get("tool")
            if isinstance(policies, list) and index < len(policies) and isinstance(policies[index], dict)
            else None
        )
        if prefix:
            return f'{prefix}policies["{tool}"]', [str(p) for p in rest]
        label = f'policies[{index}] (tool "{tool}")' if isinstance(tool, str) else f"policies[{index}]"
        return label, [str(p) for p in rest]
    if head == "compensators" and rest:
        tool = rest.pop(0)
        # A bad dict key is reported as "[key]" by pydantic; the entry is the same either way.
        if rest and rest[0] == "[key]":
            rest = ["tool"]
        elif len(rest) >= 2 and rest[-1] == "[key]":
            # A bad key inside the entry (a header name in headers_env): the message names it.
            rest = rest[:-2]
        return f'{prefix}compensators["{tool}"]', [str(p) for p in rest]
    return f"{prefix}{head}", [str(p) for p in rest]


def _format_errors(exc: ValidationError, data: Any, prefix: str) -> list[str]:
    problems: list[str] = []
    for error in exc.errors():
        entry, fields = _where(tuple(error["loc"]), data, prefix)
        message = _message(error)
        # Model-level checks already name their field ("compensation: …") or speak of the entry.
        if error["type"] == "duplicate":
            problems.append(message)
            continue
        if error["type"] == "extra_forbidden" and fields:
            problems.append(f"{entry}: {'.'.join(fields)}: unknown key")
            continue
        problems.append(f"{entry}: {'.'.join(fields)}: {message}" if fields else f"{entry}: {message}")
    return problems


def _rules_and_limits_problems(native: Any, prefix: str) -> list[str]:
    """Every problem of the policies' ``rules`` and ``limits``, each naming its policy, the rule or
    limit index and the field: ``policies[2] (tool "payments.charge"): rules[1].if.gt: expected a
    number, got '10000'``."""
    policies = native.get("policies") if isinstance(native, dict) else None
    if not isinstance(policies, list):
        return []
    problems: list[str] = []
    for index, policy in enumerate(policies):
        if not isinstance(policy, dict):
            continue
        entry, _ = _where(("policies", index), native, prefix)
        if policy.get("rules") is not None:
            problems.extend(f"{entry}: {p}" for p in rules_problems(policy["rules"]))
        if policy.get("limits") is not None:
            problems.extend(f"{entry}: {p}" for p in limits_problems(policy["limits"]))
    return problems


def policy_file_parse(data: Any, *, source: str = "policy file") -> PolicyDocument:
    """Validate a decoded policy file in either layout; raise ``PolicyFileError`` listing every
    problem."""
    if not isinstance(data, dict):
        raise PolicyFileError(source, ["file: must be a JSON object"])
    layout = NATIVE
    prefix = ""
    problems = _Problems()
    native: Any = data
    if AGENT_SAFETY in data:
        layout, prefix = AGENT_SAFETY, "agentSafety."
        for key in data:
            if key != AGENT_SAFETY:
                problems.add(
                    key, 'unknown key next to "agentSafety" (mixing the two layouts is not supported)'
                )
        native = _translate_agent_safety(data[AGENT_SAFETY], problems)
    try:
        parsed = PolicyFileIn.model_validate(native)
    except ValidationError as exc:
        problems.items.extend(_format_errors(exc, native, prefix))
        parsed = None
    problems.items.extend(_rules_and_limits_problems(native, prefix))
    if problems.items or parsed is None:
        raise PolicyFileError(source, problems.items)

    policies = [
        {
            "tool": p.tool,
            "risk": p.risk,
            "approval": p.approval,
            "action_class": p.action_class,
            "compensation": p.effective_compensation(),
            "compensation_tool": p.compensation_tool or "",
            "compensation_args": p.compensation_args,
            # Only when the file sets them (the content hash of a file without them is unchanged);
            # the loader stores the defaults for the others (POLICY_DEFAULTS).
            **({"approvers": p.approvers} if p.approvers is not None else {}),
            **({"rules": p.rules} if p.rules else {}),
            **({"limits": p.limits} if p.limits else {}),
        }
        for p in parsed.policies
    ]
    compensators = {
        tool: {
            "kind": spec.kind,
            "url": spec.webhook or spec.mcp or "",
            "secret": spec.secret or "",
            "secret_env": spec.secret_env or "",
            "python_path": spec.python or "",
            "mcp_tool": spec.tool or "",
            "headers_env": dict(spec.headers_env or {}),
            "reader_path": spec.reader or "",
        }
        for tool, spec in parsed.compensators.items()
    }
    # Only what the file says is stored; the resolver layers it over the global set and the
    # built-in defaults, so an omitted section means "inherit", not "reset".
    return PolicyDocument(
        layout=layout,
        default_policy=parsed.default_policy.model_dump(exclude_none=True) if parsed.default_policy else {},
        policies=policies,
        compensators=compensators,
        unwind=parsed.unwind.model_dump(exclude_none=True) if parsed.unwind else {},
        auto_compensate=parsed.auto_compensate.model_dump(exclude_unset=True)
        if parsed.auto_compensate
        else {},
        audit=json.loads(canonical_json(parsed.audit or {})),
    )


def policy_file_read(path: str | Path) -> Any:
    """Decode a policy file, turning I/O and JSON errors into a ``PolicyFileError``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyFileError(source, ["file: does not exist"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyFileError(source, [f"file: cannot be read ({exc})"]) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyFileError(
            source, [f"file: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"]
        ) from None


# --- Loading ---------------------------------------------------------------------------------


@dataclass
class LoadReport:
    source: str
    layout: str
    scope: str
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # What the file's author should know about the scope as it is after the load, whether or not
    # this load changed it (``policy_load_warnings``), one sentence each.
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.removed)

    def summary(self) -> str:
        return f"{len(self.created)} created, {len(self.updated)} updated, {len(self.unchanged)} unchanged"

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "layout": self.layout,
            "scope": self.scope,
            "created": self.created,
            "updated": self.updated,
            "unchanged": self.unchanged,
            "removed": self.removed,
        }


# What a tool policy row holds for what its entry in the file does not set.
POLICY_DEFAULTS: dict[str, Any] = {"approvers": 1, "rules": [], "limits": []}


def _upsert(model: type[Any], *, lookup: dict[str, Any], values: dict[str, Any]) -> str:
    """Create or update one row; return "created", "updated" or "unchanged". An unchanged row is
    not saved at all, so its ``loaded_at`` stays put and a repeat load changes nothing."""
    obj = model.objects.select_for_update().filter(**lookup).first()
    if obj is None:
        model.objects.create(**lookup, **values)
        return "created"
    if all(getattr(obj, name) == value for name, value in values.items()):
        return "unchanged"
    for name, value in values.items():
        setattr(obj, name, value)
    obj.save()
    return "updated"


@transaction.atomic
def policy_file_load(
    *, document: PolicyDocument, source: str, tenant: Tenant | None, actor: Actor
) -> LoadReport:
    """Replace the policy set of one scope (a tenant, or global) with ``document``.

    Tool policies and compensators of that scope that the file no longer lists are removed: the
    file is the whole truth for its scope.
    """
    scope = tenant.slug if tenant else "global"
    # Two loads of one scope at once would interleave their upserts and deletions.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"policies:{scope}"])
    report = LoadReport(source=source, layout=document.layout, scope=scope)

    outcome = _upsert(
        PolicySet,
        lookup={"tenant": tenant},
        values={
            "default_policy": document.default_policy,
            "unwind": document.unwind,
            "auto_compensate": document.auto_compensate,
            "audit": document.audit,
            "source": source,
            "content_hash": document.content_hash,
        },
    )
    getattr(report, outcome).append("policy set")

    for policy in document.policies:
        # A policy the file lists without rules has none, whatever it had before.
        values = {**POLICY_DEFAULTS, **{k: v for k, v in policy.items() if k != "tool"}}
        outcome = _upsert(
            ToolPolicy, lookup={"tenant": tenant, "tool": policy["tool"]}, values={**values, "source": source}
        )
        getattr(report, outcome).append(f"policy {policy['tool']}")
    stale = ToolPolicy.objects.filter(tenant=tenant).exclude(tool__in=[p["tool"] for p in document.policies])
    report.removed.extend(f"policy {tool}" for tool in stale.order_by("tool").values_list("tool", flat=True))
    stale.delete()

    for tool, spec in document.compensators.items():
        outcome = _upsert(
            Compensator, lookup={"tenant": tenant, "tool": tool}, values={**spec, "source": source}
        )
        getattr(report, outcome).append(f"compensator {tool}")
    stale_comp = Compensator.objects.filter(tenant=tenant).exclude(tool__in=list(document.compensators))
    report.removed.extend(
        f"compensator {tool}" for tool in stale_comp.order_by("tool").values_list("tool", flat=True)
    )
    stale_comp.delete()

    # A repeat load writes nothing, not even an audit event: the log records changes.
    if report.changed:
        policy_set = PolicySet.objects.get(tenant=tenant)
        if tenant is not None:
            audit_record(
                tenant=tenant,
                actor=actor,
                kind="policies.loaded",
                subject=policy_set,
                reason=f"loaded {source}",
                data={**report.as_dict(), "content_hash": document.content_hash},
            )
        else:
            # Audit events belong to a tenant's chain; a global load has none, so it is logged.
            logger.info(
                "policies.loaded", actor=actor.label, content_hash=document.content_hash, **report.as_dict()
            )
    report.warnings = policy_load_warnings(tenant=tenant)
    return report


def policy_load_warnings(*, tenant: Tenant | None) -> list[str]:
    """Every warning about a scope's policies, in one list: compensations whose compensator does
    not reach the upstream that performed their tool, so undoing them waits for a person every time
    (``ledger.upstreams``; each tenant of the global scope); then compensating tools that delete or
    move money and run unattended (``ledger.compensation_risks``)."""
    checked = [tenant] if tenant is not None else list(Tenant.objects.order_by("slug"))
    warnings = [
        f"tenant {each.slug}: {mismatch['message']}"
        for each in checked
        for mismatch in policy_upstream_mismatches(tenant=each)
    ]
    warnings.extend(w.message for w in unattended_destructive_compensations(tenant=tenant))
    return warnings


def policies_load_file(*, path: str | Path, tenant: Tenant | None, actor: Actor) -> LoadReport:
    """Read, validate and load a policy file. Raises ``PolicyFileError`` before touching the
    database when the file has any problem."""
    source = str(path)
    document = policy_file_parse(policy_file_read(path), source=source)
    return policy_file_load(document=document, source=source, tenant=tenant, actor=actor)
