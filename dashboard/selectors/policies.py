"""The policies page's reads: each tenant's tool policies (rules and limits in plain words, the read
that takes a before-image), its compensators and readers (where they point only for those who
operate the tenant; never a secret), the policy file's settings and the warnings about
compensations that reach another upstream or run unattended, and about before-images."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ledger.models import Compensator, StateReader, Tenant, ToolPolicy
from ledger.policies.before_checks import BeforeWarning, before_warnings, readers_in_force
from ledger.policies.compensation_risks import CompensationWarning, unattended_destructive_compensations
from ledger.policies.deadlines import deadline_summary
from ledger.policies.resolve import policies_in_force, policy_settings_for
from ledger.policies.rule_compile import compile_rules
from ledger.policies.upstream_reach import policy_upstream_mismatches
from ledger.upstreams import compensators_in_force
from recovery.compensator_checks import check_flag, latest_checks
from recovery.models import CompensatorCheck


@dataclass
class PolicyRow:
    """A tool policy and its rules, limits and approvers in plain words."""

    policy: ToolPolicy
    rules: list[str]
    limits: list[str]
    approvers: int
    # Its approval deadline in words (``ledger.policies.deadlines``).
    deadline: str = ""
    # The read that takes its before-image: {"tool", "args" (as JSON text, "" for none), "path"}.
    before: dict[str, str] | None = None


def _before_shown(before: Any) -> dict[str, str] | None:
    if not isinstance(before, dict) or not before.get("tool"):
        return None
    args = before.get("args") or {}
    return {
        "tool": str(before["tool"]),
        "args": json.dumps(args, sort_keys=True, ensure_ascii=False, default=str) if args else "",
        "path": str(before.get("path") or ""),
    }


def _policy_row(policy: ToolPolicy) -> PolicyRow:
    compiled = compile_rules(policy.rules, policy.limits)
    problems = [f"Cannot be applied, every call is refused: {p}" for p in compiled.problems]
    return PolicyRow(
        policy=policy,
        rules=problems or [f"{rule.index}. {rule.description}" for rule in compiled.rules],
        limits=[limit.description[0].upper() + limit.description[1:] for limit in compiled.limits],
        approvers=policy.approvers,
        deadline=deadline_summary(
            seconds=policy.approval_timeout_s, on_timeout=policy.on_timeout, escalate_to=policy.escalate_to
        ),
        before=_before_shown(policy.before),
    )


@dataclass(frozen=True)
class CompensatorRow:
    """A registered compensator as the policies page shows it. ``target`` (the webhook or MCP URL,
    or the Python path) and ``reader`` are None for a reader who may not operate the tenant: a
    viewer sees that a compensator exists and of which kind, not where it points."""

    id: int
    tool: str
    kind: str
    kind_display: str
    target: str | None
    mcp_tool: str | None
    reader: str | None
    scope: str
    source: str
    # The newest dashboard check where it points now (recovery.compensator_checks), and why the
    # compensator is flagged ("" when it passed a recent check).
    last_check: CompensatorCheck | None = None
    flag: str = ""


def _compensator_row(
    compensator: Compensator, *, show_target: bool, last_check: CompensatorCheck | None = None
) -> CompensatorRow:
    target = compensator.url or compensator.python_path
    return CompensatorRow(
        id=compensator.pk,
        last_check=last_check,
        flag=check_flag(last_check),
        tool=compensator.tool,
        kind=compensator.kind,
        kind_display=compensator.get_kind_display(),
        target=target if show_target else None,
        mcp_tool=compensator.mcp_tool if show_target else None,
        reader=compensator.reader_path if show_target else None,
        scope="tenant" if compensator.tenant_id else "global",
        source=compensator.source,
    )


@dataclass(frozen=True)
class ReaderRow:
    """A registered reader of a ``before`` read as the policies page shows it: its kind for
    everyone; where it points (``target``, ``mcp_tool``) only for those who may see where
    compensators point, as ``CompensatorRow``. A webhook's secret is never shown."""

    tool: str
    kind: str
    kind_display: str
    target: str | None
    mcp_tool: str | None
    scope: str
    source: str


def _reader_row(reader: StateReader, *, show_target: bool) -> ReaderRow:
    return ReaderRow(
        tool=reader.tool,
        kind=reader.kind,
        kind_display=reader.get_kind_display(),
        target=(reader.url or reader.python_path) if show_target else None,
        mcp_tool=reader.mcp_tool if show_target else None,
        scope="tenant" if reader.tenant_id else "global",
        source=reader.source,
    )


@dataclass
class TenantPolicies:
    tenant: Tenant
    policies: list[PolicyRow]
    compensators: list[CompensatorRow]
    show_targets: bool
    settings_source: str
    default_policy: dict[str, Any]
    unwind: dict[str, Any]
    auto_compensate: dict[str, Any]
    # The default policy's approval deadline in words.
    default_deadline: str = ""
    # Tool/compensator pairs whose compensator does not reach the upstream the tool was recorded
    # on (``ledger.policies.upstream_reach.policy_upstream_mismatches``).
    upstream_mismatches: list[dict[str, Any]] = field(default_factory=list)
    # Compensating tools that delete or move money and run unattended (the residual risk).
    compensation_warnings: list[CompensationWarning] = field(default_factory=list)
    # The readers of the before reads, and what is known not to work about before-images
    # (``ledger.policies.before_checks``).
    readers: list[ReaderRow] = field(default_factory=list)
    before_warnings: list[BeforeWarning] = field(default_factory=list)

    @property
    def reads_images(self) -> bool:
        """Whether a policy in force has a before read (the readers' section is shown then)."""
        return any(row.before for row in self.policies)


def policies_for(*, tenant: Tenant, show_targets: bool) -> TenantPolicies:
    """The policies page's section for ``tenant``; ``show_targets``: whether the reader may see
    where compensators point (operators and admins of the tenant)."""
    compensators = compensators_in_force(tenant_id=tenant.pk)
    policy_settings = policy_settings_for(tenant)
    latest = latest_checks(tenant=tenant, rows=compensators)
    return TenantPolicies(
        tenant=tenant,
        policies=[_policy_row(policy) for policy in policies_in_force(tenant=tenant)],
        compensators=[
            _compensator_row(c, show_target=show_targets, last_check=latest.get(c.tool)) for c in compensators
        ],
        show_targets=show_targets,
        settings_source=policy_settings.source,
        default_policy=policy_settings.default_policy,
        unwind=policy_settings.unwind,
        auto_compensate=policy_settings.auto_compensate,
        default_deadline=deadline_summary(
            seconds=policy_settings.default_policy.get("approval_timeout_s"),
            on_timeout=str(policy_settings.default_policy.get("on_timeout") or "reject"),
            escalate_to=str(policy_settings.default_policy.get("escalate_to") or ""),
        ),
        upstream_mismatches=policy_upstream_mismatches(tenant=tenant),
        compensation_warnings=unattended_destructive_compensations(tenant=tenant),
        readers=[_reader_row(r, show_target=show_targets) for r in readers_in_force(tenant=tenant)],
        before_warnings=before_warnings(tenant=tenant),
    )
