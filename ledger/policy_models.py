"""The policies as loaded: the policy set of a scope, the tool policies, the stamp that moves
with every write to them, pauses (the kill switch) and the registered compensators. Re-exported
by ``ledger.models``, where the rest of the record is."""

from __future__ import annotations

import pgtrigger
from django.conf import settings
from django.db import models
from django.db.models import Q

from infra import ids
from infra.json_text import JSONField
from ledger.choices import ActionClass, ApprovalMode, CompensationStrategy, Risk

_BUMP_POLICY_STAMP = (
    "INSERT INTO ledger_policystamp (id, version) VALUES (1, nextval('ledger_policystamp_version_seq')) "
    "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version; RETURN NULL;"
)


def _stamp_trigger(name: str) -> pgtrigger.Trigger:
    """The trigger that moves the policy stamp on every write to a table whose rows a process may
    keep under the stamp (``ledger.policies.resolve.StampCache``)."""
    return pgtrigger.Trigger(
        name=name,
        operation=pgtrigger.Insert | pgtrigger.Update | pgtrigger.Delete | pgtrigger.Truncate,
        when=pgtrigger.After,
        level=pgtrigger.Statement,
        func=_BUMP_POLICY_STAMP,
    )


class PolicySet(models.Model):
    """What a policy file says beyond per-tool policies: the default policy, unwind behaviour and
    auto-compensation, globally (tenant NULL) or for one tenant."""

    tenant = models.ForeignKey("ledger.Tenant", null=True, blank=True, on_delete=models.CASCADE)
    default_policy = JSONField(default=dict)
    unwind = JSONField(default=dict)
    auto_compensate = JSONField(default=dict)
    audit = JSONField(default=dict, blank=True)
    source = models.CharField(max_length=500, blank=True, default="")
    content_hash = models.CharField(max_length=64, blank=True, default="")
    loaded_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant"], name="policyset_one_per_scope", nulls_distinct=False),
        ]
        # The default policy lives here: a process keeps it beside the tool policies, under the
        # same stamp (ledger.policies), so a write here moves the stamp too.
        triggers = [_stamp_trigger("policyset_stamp")]

    def __str__(self) -> str:
        return f"policy set ({self.tenant or 'global'})"


class PolicyStamp(models.Model):
    """One row whose ``version`` a database trigger moves (from a sequence, so a value is never
    reused, even after a rollback) with every write to ``ledger_toolpolicy``, in the writer's
    transaction: a process may keep the tool-policy table it read while the stamp it read with it
    is still the current one (``ledger.policies``). Whoever writes the policies — the loader, the
    admin, a shell, raw SQL — moves it; nothing in Python has to remember to."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    version = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"tool-policy stamp {self.version}"


class ToolPolicy(models.Model):
    tenant = models.ForeignKey(
        "ledger.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="tool_policies"
    )
    tool = models.CharField(max_length=200, help_text="Exact tool name or a glob such as crm.update_*")
    risk = models.CharField(max_length=16, choices=Risk.choices)
    approval = models.CharField(max_length=16, choices=ApprovalMode.choices)
    action_class = models.CharField(max_length=32, choices=ActionClass.choices)
    compensation = models.CharField(
        max_length=16, choices=CompensationStrategy.choices, default=CompensationStrategy.CUSTOM
    )
    compensation_tool = models.CharField(max_length=200, blank=True, default="")
    # Templates for the compensating tool's args ("$args.<path>", "$result.<path>", "$target_id",
    # "$target_type"), filled from the forward action; None: the forward action's args as they are.
    compensation_args = JSONField(null=True, blank=True)
    # The read that takes the before- and after-image of an update (``ledger.policies.before_images``):
    # ``{"tool", "args", "path"}`` as the loader validated it; None: the agent supplies its snapshots.
    before = JSONField(null=True, blank=True)
    # Rules on the call's args (first match wins) and rate/sum limits, as the loader validated
    # them; compiled once per policy-table version (ledger.policies.rule_compile, .resolve).
    rules = JSONField(default=list, blank=True)
    limits = JSONField(default=list, blank=True)
    # How many distinct people must grant an approval this policy asks for (a rule may raise it).
    approvers = models.PositiveSmallIntegerField(default=1)
    # The approval deadline (ledger.policies.deadlines): how long an approval this policy asks
    # for waits (None: SAGA_APPROVAL_EXPIRY_H), and what a timeout does (reject, or escalate once
    # to ``escalate_to``, a role that approves or a username).
    approval_timeout_s = models.PositiveIntegerField(null=True, blank=True)
    on_timeout = models.CharField(max_length=16, default="reject", db_default="reject")
    escalate_to = models.CharField(max_length=150, blank=True, default="", db_default="")
    source = models.CharField(max_length=500, blank=True, default="")
    loaded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tool"]
        verbose_name_plural = "tool policies"
        triggers = [_stamp_trigger("toolpolicy_stamp")]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "tool"], name="toolpolicy_unique_pattern", nulls_distinct=False
            ),
            models.CheckConstraint(
                condition=Q(risk__in=["low", "medium", "high", "critical"]), name="toolpolicy_risk_valid"
            ),
            models.CheckConstraint(
                condition=Q(approval__in=["auto", "manual"]), name="toolpolicy_approval_valid"
            ),
            models.CheckConstraint(
                condition=Q(approvers__gte=1, approvers__lte=10), name="toolpolicy_approvers_valid"
            ),
            models.CheckConstraint(
                condition=Q(on_timeout__in=["reject", "escalate"]), name="toolpolicy_on_timeout_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} ({self.tenant or 'global'})"

    @property
    def is_glob(self) -> bool:
        return any(ch in self.tool for ch in "*?[")


class Pause(models.Model):
    """A kill switch: while active (not lifted), new runs of a matching agent and new actions of a
    matching tool are refused (409 ``paused``). ``agent`` and ``tool`` are exact names or globs;
    at least one is set. Matching and the hot-path check live in ``ledger.services.pauses``."""

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_pause_id, editable=False)
    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.CASCADE, related_name="pauses")
    agent = models.CharField(max_length=200, blank=True, default="")
    tool = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_key = models.ForeignKey(
        "ledger.AgentKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    lifted_by_key = models.ForeignKey(
        "ledger.AgentKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    lift_reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=~Q(agent="", tool=""), name="pause_names_agent_or_tool"),
        ]
        indexes = [
            models.Index(fields=["tenant"], name="pause_active", condition=Q(lifted_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.id} (agent={self.agent or '*'}, tool={self.tool or '*'})"

    @property
    def is_active(self) -> bool:
        return self.lifted_at is None


class Compensator(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "HTTP webhook"
        PYTHON = "python", "Python callable"
        MCP = "mcp", "MCP tool"

    tenant = models.ForeignKey(
        "ledger.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="compensators"
    )
    tool = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.URLField(max_length=2000, blank=True, default="")
    # A literal secret from the policy file, or the name of the environment variable holding
    # it (preferred: the secret then never touches the database).
    secret = models.CharField(max_length=500, blank=True, default="")
    secret_env = models.CharField(max_length=200, blank=True, default="")
    python_path = models.CharField(max_length=500, blank=True, default="")
    # An MCP compensator: the tool called on the server at ``url`` (Streamable HTTP), and the
    # headers it is sent with, as header name → the environment variable holding the value (the
    # values never touch the database).
    mcp_tool = models.CharField(max_length=200, blank=True, default="")
    headers_env = JSONField(blank=True, default=dict)
    # Optional reader that returns the target's current state, for drift checks.
    reader_path = models.CharField(max_length=500, blank=True, default="")
    source = models.CharField(max_length=500, blank=True, default="")
    loaded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tool"]
        # The registered compensators are kept per process under the policy stamp
        # (recovery.compensators): a write here moves it too.
        triggers = [_stamp_trigger("compensator_stamp")]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "tool"], name="compensator_unique_tool", nulls_distinct=False
            ),
            models.CheckConstraint(
                condition=(Q(kind="webhook") & ~Q(url=""))
                | (Q(kind="python") & ~Q(python_path=""))
                | (Q(kind="mcp") & ~Q(url="") & ~Q(mcp_tool="")),
                name="compensator_target_present",
            ),
        ]

    def __str__(self) -> str:
        if self.kind == self.Kind.MCP:
            return f"{self.tool} → {self.mcp_tool} at {self.url}"
        return f"{self.tool} → {self.url or self.python_path}"


class StateReader(models.Model):
    """How the worker reads a target's current state through a read tool named by a policy's
    ``before`` (the policy file's ``readers``): an MCP tool, a signed webhook or a Python callable.
    The worker reads before an undo step (drift) and after it (verification)."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "HTTP webhook"
        PYTHON = "python", "Python callable"
        MCP = "mcp", "MCP tool"

    tenant = models.ForeignKey(
        "ledger.Tenant", null=True, blank=True, on_delete=models.CASCADE, related_name="state_readers"
    )
    # The read tool as policies name it (``before.tool``).
    tool = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.URLField(max_length=2000, blank=True, default="")
    secret = models.CharField(max_length=500, blank=True, default="")
    secret_env = models.CharField(max_length=200, blank=True, default="")
    python_path = models.CharField(max_length=500, blank=True, default="")
    mcp_tool = models.CharField(max_length=200, blank=True, default="")
    headers_env = JSONField(blank=True, default=dict)
    source = models.CharField(max_length=500, blank=True, default="")
    loaded_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tool"]
        triggers = [_stamp_trigger("statereader_stamp")]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "tool"], name="statereader_unique_tool", nulls_distinct=False
            ),
            models.CheckConstraint(
                condition=(Q(kind="webhook") & ~Q(url=""))
                | (Q(kind="python") & ~Q(python_path=""))
                | (Q(kind="mcp") & ~Q(url="") & ~Q(mcp_tool="")),
                name="statereader_target_present",
            ),
        ]

    def __str__(self) -> str:
        if self.kind == self.Kind.MCP:
            return f"reader {self.tool} → {self.mcp_tool} at {self.url}"
        return f"reader {self.tool} → {self.url or self.python_path}"
