"""Which policy governs a tool call.

Precedence, most specific first: an exact tool name beats a glob; then a tenant's own policy beats
the global one; among globs, the one with more literal characters wins (``crm.update_*`` beats
``crm.*``). A tool nothing matches gets the default policy (the tenant's, else the global one,
else the built-in conservative default: high risk, manual approval, irreversible).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Generic, TypeVar

from django.db.models import Q
from django.db.models.expressions import RawSQL

from infra import errors
from infra.conf import saga
from ledger.models import (
    RISK_ORDER,
    ActionClass,
    ApprovalMode,
    CompensationStrategy,
    PolicySet,
    Risk,
    Tenant,
    ToolPolicy,
)
from ledger.policies.rule_compile import compile_rules
from ledger.policies.rules import NO_RULES, Applied, CompiledRules, Limit, RulesApplied

T = TypeVar("T")

BUILTIN_DEFAULT_POLICY: dict[str, str] = {
    "risk": Risk.HIGH,
    "approval": ApprovalMode.MANUAL,
    "action_class": ActionClass.EXTERNAL_IRREVERSIBLE,
    "compensation": CompensationStrategy.NONE,
}


def builtin_unwind() -> dict[str, Any]:
    """The unwind block before any policy file: the step attempts come from the SAGA_MAX_ATTEMPTS
    setting, which a policy file's ``unwind.max_attempts`` overrides."""
    return {
        "on_compensation_failure": "alert_and_continue",
        "step_timeout_s": 30,
        "max_attempts": saga().default_max_attempts,
    }


BUILTIN_AUTO_COMPENSATE: dict[str, Any] = {"max_risk": None}


@dataclass(frozen=True)
class ResolvedPolicy:
    tool: str
    pattern: str
    risk: str
    approval: str
    action_class: str
    compensation: str
    compensation_tool: str = ""
    # The policy's templates for the compensating tool's args (``compensation_args_fill``); None:
    # the policy does not set them.
    compensation_args: Any = None
    scope: str = "global"  # "tenant", "global" or "default"
    source: str = ""
    approvers: int = 1
    # The approval deadline (ledger.policies.deadlines): None → SAGA_APPROVAL_EXPIRY_H.
    approval_timeout_s: int | None = None
    on_timeout: str = "reject"
    escalate_to: str = ""
    # The read that takes the action's before- and after-image (``ledger.policies.before_images``):
    # ``{"tool", "args", "path"}``; None: the agent supplies its snapshots.
    before: dict[str, Any] | None = None
    # The policy's rules and limits, compiled (``ledger.policies.rules``); not part of ``as_dict``.
    compiled: CompiledRules = field(default=NO_RULES, compare=False, repr=False)

    @property
    def requires_approval(self) -> bool:
        return self.approval == ApprovalMode.MANUAL

    @property
    def limits(self) -> tuple[Limit, ...]:
        return self.compiled.limits

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "compiled"}
        if self.before is None:
            # Only where the policy reads images: an action's frozen policy is as it was without.
            del data["before"]
        data["requires_approval"] = self.requires_approval
        return data

    def with_args(self, args: Any) -> tuple[ResolvedPolicy, RulesApplied | None]:
        """The policy as it applies to a call with ``args``, and the rules that applied (None:
        none). The first rule whose condition is true sets risk, approval and approvers
        (``approvers`` above 1 means manual approval). A rule before it whose condition a value's
        kind left undecided counts as far as it is stricter than that outcome: the call gets the
        strictest of both answers, on each of effect, risk, approval and approvers — so a rule that
        tightens applies, one that relaxes does not, and a value's type never buys an unattended
        call (``ledger.policies.rules``). A deny among the rules that apply → ``PolicyDenied`` naming
        it; so does a policy whose stored rules do not compile (fail closed: a broken rule must
        not quietly allow what it was written to stop)."""
        if self.compiled.problems:
            raise errors.PolicyDenied(
                f"The policy for {self.tool} ({self.pattern}) has rules that cannot be applied "
                f"({'; '.join(self.compiled.problems[:3])}); the call is refused until they are fixed.",
                details={"policy": self.pattern, "problems": list(self.compiled.problems[:10])},
            )
        decision = self.compiled.decide(args)
        matched = decision.matched
        if matched is None and not decision.undecided:
            return self, None
        # What the call gets if every undecided condition is false: the matched rule, else the policy.
        result = self._outcome(matched.then) if matched is not None and not matched.denies else self
        applied = [
            undecided
            for undecided in decision.undecided
            if undecided.rule.denies or self._outcome(undecided.rule.then)._stricter_than(result)
        ]
        for undecided in applied:
            if not undecided.rule.denies:
                result = result._strictest(self._outcome(undecided.rule.then))
        if matched is not None:
            applied.append(Applied(matched))
        if not applied:
            return self, None
        denying = next((a for a in applied if a.rule.denies), None)
        if denying is not None:
            rule, why = denying.rule, ""
            if denying.undecided:
                why = (
                    f" The value at {', '.join(denying.undecided)} is not of a kind the rule compares, "
                    "and rules fail closed on types."
                )
            raise errors.PolicyDenied(
                f"The policy for {self.tool} ({self.pattern}) refuses this call: rule {rule.index} "
                f"({rule.description}).{why} Nothing was recorded.",
                details={
                    "policy": self.pattern,
                    "rule": rule.index,
                    "description": rule.description,
                    **({"undecided": list(denying.undecided)} if denying.undecided else {}),
                },
            )
        return result, RulesApplied(tuple(applied))

    def _outcome(self, then: Mapping[str, Any]) -> ResolvedPolicy:
        """This policy with a rule's ``then`` (not a deny) applied."""
        approval = str(then.get("approval", self.approval))
        # A rule that lifts the approval (auto) lifts the policy's approvers with it.
        approvers = int(then.get("approvers", self.approvers if approval == ApprovalMode.MANUAL else 1))
        if approvers > 1:
            approval = ApprovalMode.MANUAL
        return replace(self, risk=str(then.get("risk", self.risk)), approval=approval, approvers=approvers)

    def _stricter_than(self, other: ResolvedPolicy) -> bool:
        """Stricter than ``other`` on at least one of risk, approval and approvers."""
        return (
            RISK_ORDER[Risk(self.risk)] > RISK_ORDER[Risk(other.risk)]
            or (self.requires_approval and not other.requires_approval)
            or self.approvers > other.approvers
        )

    def _strictest(self, other: ResolvedPolicy) -> ResolvedPolicy:
        """The stricter of the two on each of risk, approval and approvers."""
        manual = self.requires_approval or other.requires_approval
        return replace(
            self,
            risk=max(self.risk, other.risk, key=lambda risk: RISK_ORDER[Risk(risk)]),
            approval=ApprovalMode.MANUAL if manual else ApprovalMode.AUTO,
            approvers=max(self.approvers, other.approvers),
        )


@dataclass(frozen=True)
class UnwindSettings:
    """How an unwind's steps live, from the policy file's ``unwind`` block. The loader validated
    and normalised the block when the file was loaded (a bad duration or failure mode is a load
    error), so nothing here parses: it only reads the canonical keys."""

    on_failure: str
    step_timeout_s: float
    max_attempts: int


@dataclass(frozen=True)
class PolicySettings:
    default_policy: dict[str, Any] = field(default_factory=lambda: dict(BUILTIN_DEFAULT_POLICY))
    unwind: dict[str, Any] = field(default_factory=builtin_unwind)
    auto_compensate: dict[str, Any] = field(default_factory=lambda: dict(BUILTIN_AUTO_COMPENSATE))
    source: str = "built-in"

    @property
    def unwind_settings(self) -> UnwindSettings:
        return UnwindSettings(
            on_failure=str(self.unwind["on_compensation_failure"]),
            step_timeout_s=float(self.unwind["step_timeout_s"]),
            max_attempts=int(self.unwind["max_attempts"]),
        )

    @property
    def auto_compensate_max_risk(self) -> str | None:
        """The highest risk an automatic compensation may undo unattended (None: never)."""
        value = self.auto_compensate.get("max_risk")
        return str(value) if value else None


def _literal_length(pattern: str) -> int:
    return sum(1 for ch in pattern if ch not in "*?[]")


def _rank(policy: ToolPolicy) -> tuple[int, int, int]:
    return (0 if policy.is_glob else 1, 1 if policy.tenant_id else 0, _literal_length(policy.tool))


def _governs(policy: ToolPolicy, tool: str) -> bool:
    return policy.tool == tool or (policy.is_glob and fnmatch.fnmatchcase(tool, policy.tool))


def policy_pick(policies: Iterable[ToolPolicy], tool: str) -> ToolPolicy | None:
    """The most specific of ``policies`` that governs ``tool`` (the precedence above), or None."""
    candidates = [p for p in policies if _governs(p, tool)]
    return max(candidates, key=_rank) if candidates else None


def policy_settings_for(tenant: Tenant | None) -> PolicySettings:
    sets = {ps.tenant_id: ps for ps in PolicySet.objects.filter(Q(tenant=tenant) | Q(tenant__isnull=True))}
    # Layered, most specific last: built-in ← global file ← tenant file. A tenant file that says
    # nothing about, say, the default policy inherits the global one instead of resetting it.
    layers = [ps for ps in (sets.get(None), sets.get(tenant.pk) if tenant else None) if ps is not None]
    if not layers:
        return PolicySettings()
    default_policy, unwind, auto_compensate = (
        dict(BUILTIN_DEFAULT_POLICY),
        builtin_unwind(),
        dict(BUILTIN_AUTO_COMPENSATE),
    )
    for layer in layers:
        default_policy.update(layer.default_policy)
        unwind.update(layer.unwind)
        auto_compensate.update(layer.auto_compensate)
    return PolicySettings(
        default_policy=default_policy,
        unwind=unwind,
        auto_compensate=auto_compensate,
        source=" + ".join(layer.source or "(unnamed)" for layer in layers),
    )


class StampCache(Generic[T]):
    """What a process keeps per tenant under the policy stamp it was read with (see PolicyStamp):
    an entry serves only a caller that holds the same stamp, just read in its transaction or about
    to be checked by the database in the same statement as the write (``saga_action_record``).
    Every write to a table the stamp covers (triggers: tool policies, policy sets, compensators),
    committed or in the caller's own transaction, moves the stamp, so a change applies from the
    very next request in every process; there is no time-based staleness. ``load`` reads after the
    stamp was read: what is kept can only be newer than the stamp says, never older."""

    def __init__(self, max_tenants: int = 1000) -> None:
        self._entries: dict[int, tuple[int, T]] = {}
        self._max_tenants = max_tenants

    def stamp(self, tenant_id: int) -> int | None:
        entry = self._entries.get(tenant_id)
        return entry[0] if entry is not None else None

    def get(self, tenant_id: int, stamp: int | None, load: Callable[[], T]) -> T:
        """The kept value for ``stamp``, else ``load()`` (kept when there is a stamp)."""
        entry = self._entries.get(tenant_id)
        if stamp is not None and entry is not None and entry[0] == stamp:
            return entry[1]
        value = load()
        if stamp is not None:
            if len(self._entries) >= self._max_tenants:
                self._entries.clear()
            self._entries[tenant_id] = (stamp, value)
        return value


# The tool policies that can apply to a tenant (compiled), and its policy settings (the default
# policy).
_TOOL_POLICIES: StampCache[list[tuple[ToolPolicy, CompiledRules]]] = StampCache()
_SETTINGS: StampCache[PolicySettings] = StampCache()


def policy_stamp_subquery() -> RawSQL:
    """The current stamp, to fold into a query the caller runs anyway (an annotation). Plain SQL:
    compiling the equivalent ORM Subquery costs more CPU than the rest of the lock statement."""
    # The table of ledger.models.PolicyStamp; a constant, no input.
    return RawSQL("SELECT version FROM ledger_policystamp WHERE id = 1", ())  # noqa: S611


def policy_stamp_cached(tenant_id: int) -> int | None:
    """The stamp this process's copy of the tenant's policies was read with (None: no copy). A
    write that relies on the copy hands the stamp to the database, which refuses the write when
    the current stamp differs (``saga_action_record``)."""
    return _TOOL_POLICIES.stamp(tenant_id)


def _tool_policies(tenant: Tenant, stamp: int | None) -> list[tuple[ToolPolicy, CompiledRules]]:
    """The tenant's and the global tool policies, each with its rules and limits compiled: once per
    stamp and process when the caller has the stamp, else for this call."""
    return _TOOL_POLICIES.get(
        tenant.pk,
        stamp,
        lambda: [
            (p, compile_rules(p.rules, p.limits))
            for p in ToolPolicy.objects.filter(Q(tenant=tenant) | Q(tenant__isnull=True))
        ],
    )


def policy_resolve(*, tenant: Tenant, tool: str, stamp: int | None = None) -> ResolvedPolicy:
    """The policy for ``tool``. ``stamp``: the PolicyStamp version the caller read in this
    transaction (``policy_stamp_subquery``); with it, the tool-policy table may come from this
    process's cache. Without it, the table is read."""
    candidates = [(p, compiled) for p, compiled in _tool_policies(tenant, stamp) if _governs(p, tool)]
    if candidates:
        best, compiled = max(candidates, key=lambda candidate: _rank(candidate[0]))
        return ResolvedPolicy(
            tool=tool,
            pattern=best.tool,
            risk=best.risk,
            approval=best.approval,
            action_class=best.action_class,
            compensation=best.compensation,
            compensation_tool=best.compensation_tool,
            compensation_args=best.compensation_args,
            scope="tenant" if best.tenant_id else "global",
            source=best.source,
            approvers=best.approvers,
            approval_timeout_s=best.approval_timeout_s,
            on_timeout=best.on_timeout,
            escalate_to=best.escalate_to,
            before=best.before,
            compiled=compiled,
        )
    settings_ = _SETTINGS.get(tenant.pk, stamp, lambda: policy_settings_for(tenant))
    default = settings_.default_policy
    return ResolvedPolicy(
        tool=tool,
        pattern="*default*",
        risk=default.get("risk", Risk.HIGH),
        approval=default.get("approval", ApprovalMode.MANUAL),
        action_class=default.get("action_class", ActionClass.EXTERNAL_IRREVERSIBLE),
        compensation=default.get("compensation", CompensationStrategy.NONE),
        compensation_tool=default.get("compensation_tool", ""),
        compensation_args=default.get("compensation_args"),
        scope="default",
        source=settings_.source,
        approval_timeout_s=default.get("approval_timeout_s"),
        on_timeout=default.get("on_timeout", "reject"),
        escalate_to=default.get("escalate_to", ""),
    )


def policies_in_force(*, tenant: Tenant) -> list[ToolPolicy]:
    """Every tool policy that can apply to the tenant: its own, then the global ones it does not
    override with the same pattern."""
    own = list(ToolPolicy.objects.filter(tenant=tenant).order_by("tool"))
    overridden = {p.tool for p in own}
    shared = [
        p for p in ToolPolicy.objects.filter(tenant__isnull=True).order_by("tool") if p.tool not in overridden
    ]
    return sorted(own + shared, key=lambda p: p.tool)


def mandated_compensation_tool(policy: ResolvedPolicy, *, tool: str) -> str:
    """The compensating tool the forward tool's policy names ("" when it leaves it to the agent)."""
    if policy.action_class == ActionClass.READ_ONLY:
        return ""
    if policy.compensation == CompensationStrategy.SNAPSHOT:
        return policy.compensation_tool or f"{tool}.restore"
    if policy.compensation_tool and policy.compensation != CompensationStrategy.NONE:
        return policy.compensation_tool
    return ""
