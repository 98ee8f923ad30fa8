"""The record: tenants, keys, runs, actions (the ledger), checkpoints, policies and the audit log.

State fields here are written only by ``ledger.services`` (and, for the states a recovery
decision drives, by ``recovery.services`` through the ledger's own transition functions).
"""

from __future__ import annotations

import pgtrigger
from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from ledger import ids
from ledger.json_text import JSONField


class Risk(models.TextChoices):
    LOW = "low", "Low"
    MEDIUM = "medium", "Medium"
    HIGH = "high", "High"
    CRITICAL = "critical", "Critical"


RISK_ORDER = {Risk.LOW: 0, Risk.MEDIUM: 1, Risk.HIGH: 2, Risk.CRITICAL: 3}


def max_risk(*risks: str) -> str:
    present = [r for r in risks if r]
    return max(present, key=lambda r: RISK_ORDER[Risk(r)]) if present else Risk.LOW


class ActionClass(models.TextChoices):
    READ_ONLY = "read_only", "Read only"
    DRAFT_ONLY = "draft_only", "Draft only"
    INTERNAL_UPDATE = "internal_update", "Internal update"
    EXTERNAL_REVERSIBLE = "external_reversible", "External, reversible"
    EXTERNAL_IRREVERSIBLE = "external_irreversible", "External, irreversible"


class ApprovalMode(models.TextChoices):
    AUTO = "auto", "Automatic"
    MANUAL = "manual", "Manual approval"


class CompensationStrategy(models.TextChoices):
    CUSTOM = "custom", "Registered compensating tool"
    SNAPSHOT = "snapshot", "Restore the before snapshot"
    CORRECTION = "correction", "Correction (irreversible action)"
    NONE = "none", "Cannot be undone"


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # The hash of the newest event on the tenant's run-less audit chain ("" before the first), so
    # deleting that chain's newest events is detectable (ledger.audit.audit_heads_verify).
    audit_head = models.CharField(max_length=64, blank=True, default="", db_default="", editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """A dashboard user's role in one tenant."""

    class Role(models.TextChoices):
        VIEWER = "viewer", "Viewer"
        OPERATOR = "operator", "Operator"
        APPROVER = "approver", "Approver"
        ADMIN = "admin", "Admin"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_one_role_per_tenant"),
            models.CheckConstraint(
                condition=Q(role__in=["viewer", "operator", "approver", "admin"]),
                name="membership_role_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class AgentKey(models.Model):
    class Scope(models.TextChoices):
        AGENT = "agent", "Agent"
        OPERATOR = "operator", "Operator"
        APPROVER = "approver", "Approver"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_key_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agent_keys")
    name = models.CharField(max_length=200)
    # The public part of the key, shown in lists and used to find the row; the secret part is
    # only ever stored as a SHA-256 digest (keys are 256-bit random, so a slow KDF buys nothing).
    prefix = models.CharField(max_length=32, unique=True)
    key_hash = models.CharField(max_length=64)
    scopes = ArrayField(models.CharField(max_length=16), default=list)
    # The person behind the key. Required for an approver key (``keys.agent_key_create``): people,
    # not credentials, approve, so a person's login and every key they own are one approver and
    # none of them grants what that person asked for. Optional for agent and operator keys, where
    # it names who asks through them. Set once, never changed (``keys.agent_key_set_owner``), so a
    # grant cannot move from one person to another. Keys issued before owners existed have none:
    # an approver key without an owner decides nothing until one is set. A deleted user leaves
    # their keys without an owner (and so, for approver keys, deciding nothing).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="owned_keys",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(scopes__contained_by=["agent", "operator", "approver"]),
                name="agentkey_scopes_valid",
            ),
            # An agent must never approve what it asked for: no key holds both.
            models.CheckConstraint(
                condition=~Q(scopes__contains=["agent", "approver"]), name="agentkey_agent_not_approver"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Run(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        COMPENSATING = "compensating", "Compensating"
        COMPENSATED = "compensated", "Compensated"
        CLOSED = "closed", "Closed"

    # A run in one of these refuses new actions, action starts and checkpoints (API.md): a late
    # background job cannot write, a failed run waits for a decision (a resume reopens it), and the
    # plan an operator reads holds still. ``ledger.services.runs.run_assert_accepts_writes``.
    CLOSED_TO_WRITES = (
        Status.FAILED,
        Status.CANCELLED,
        Status.COMPENSATING,
        Status.COMPENSATED,
        Status.CLOSED,
    )
    # Of those, the ones that also refuse the agent's report of how an action it already had
    # running ended. A failed run still takes that report: it is the truth arriving late, and a
    # resume or an unwind decided afterwards must work from it. A cancelled or compensating run
    # has turned those actions into ``unknown`` for a person to reconcile.
    CLOSED_TO_REPORTS = (Status.CANCELLED, Status.COMPENSATING, Status.COMPENSATED, Status.CLOSED)

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_run_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs")
    agent = models.CharField(max_length=200)
    request = models.TextField()
    external_id = models.CharField(max_length=200, blank=True, default="")
    user_id = models.CharField(max_length=200, blank=True, default="")
    goal = models.TextField(blank=True, default="")
    trace_url = models.URLField(max_length=2000, blank=True, default="")
    resume_url = models.URLField(max_length=2000, blank=True, default="")
    metadata = JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    summary = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    failure_reason = models.CharField(max_length=64, blank=True, default="")
    failed_action = models.ForeignKey(
        "Action", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_key = models.ForeignKey(AgentKey, null=True, blank=True, on_delete=models.SET_NULL)
    # The agent that owns the run: the name of the key that created it (every key issued with that
    # name is the same agent). An agent-scope key reaches only the runs its agent owns.
    owner = models.CharField(max_length=200, blank=True, default="", db_default="")
    # Counters owned by the run row (updated under its row lock): action sequence numbers and
    # the completion order that LIFO compensation follows.
    action_count = models.PositiveIntegerField(default=0)
    completion_count = models.PositiveIntegerField(default=0)
    # The hash of the run's latest audit event ("" before the first): the head of its chain, moved
    # by ledger.audit.audit_record with a compare-and-set, which also serialises the chain's writers.
    # db_default too: bulk loaders (seed_bench's COPY) leave the column out.
    audit_head = models.CharField(max_length=64, blank=True, default="", db_default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    status__in=[
                        "running",
                        "succeeded",
                        "failed",
                        "cancelled",
                        "compensating",
                        "compensated",
                        "closed",
                    ]
                ),
                name="run_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="run_tenant_created"),
            models.Index(fields=["tenant", "status", "-created_at"], name="run_tenant_status"),
            models.Index(fields=["tenant", "agent", "-created_at"], name="run_tenant_agent"),
            models.Index(fields=["tenant", "owner", "-created_at"], name="run_tenant_owner"),
            models.Index(fields=["tenant", "external_id"], name="run_tenant_external"),
            models.Index(
                fields=["last_heartbeat_at"], name="run_running_heartbeat", condition=Q(status="running")
            ),
        ]

    def __str__(self) -> str:
        return self.id

    @property
    def accepts_actions(self) -> bool:
        return self.status not in self.CLOSED_TO_WRITES

    @property
    def accepts_reports(self) -> bool:
        """Whether the agent may still report the outcome of an action it had running."""
        return self.status not in self.CLOSED_TO_REPORTS


class Action(models.Model):
    class Status(models.TextChoices):
        PLANNED = "planned", "Planned"
        AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        UNKNOWN = "unknown", "Outcome unknown"
        COMPENSATING = "compensating", "Compensating"
        COMPENSATED = "compensated", "Compensated"
        COMPENSATION_FAILED = "compensation_failed", "Compensation failed"

    class ErrorLayer(models.TextChoices):
        MODEL = "model", "Model"
        TOOL = "tool", "Tool"
        WORKFLOW = "workflow", "Workflow"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_action_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="actions")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="actions")
    seq = models.PositiveIntegerField()
    tool = models.CharField(max_length=200)
    target_type = models.CharField(max_length=100, blank=True, default="")
    target_id = models.CharField(max_length=500, blank=True, default="")
    args = JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=255)
    # The authenticated agent that recorded it: the recording key's name (keys of one name are one
    # agent), never the name a run declares. ``per: agent`` limits count by it.
    owner = models.CharField(max_length=200, blank=True, default="", db_default="")
    # SHA-256 of the canonical recorded payload: a replay with another payload is refused.
    payload_hash = models.CharField(max_length=64)
    intent = JSONField(default=dict, blank=True)
    before_snapshot = JSONField(null=True, blank=True)
    after_snapshot = JSONField(null=True, blank=True)
    result = JSONField(null=True, blank=True)
    risk = models.CharField(max_length=16, choices=Risk.choices)
    action_class = models.CharField(max_length=32, choices=ActionClass.choices)
    approval_mode = models.CharField(max_length=16, choices=ApprovalMode.choices)
    requires_approval = models.BooleanField(default=False)
    # The policy that applied when the action was recorded (pattern, source): the record must
    # not change meaning when the policy file changes later.
    policy = JSONField(default=dict, blank=True)
    compensation_strategy = models.CharField(
        max_length=16, choices=CompensationStrategy.choices, default=CompensationStrategy.NONE
    )
    compensation_tool = models.CharField(max_length=200, blank=True, default="")
    compensation_args = JSONField(null=True, blank=True)
    # The gateway that forwarded the call and the upstream that performed it (``{"gateway",
    # "upstream"}``, null when the agent called the tool itself): an undo must reach that upstream
    # (``ledger.upstreams``). Written by ``saga_action_record`` with the rest of the row.
    via = JSONField(null=True, blank=True)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.PLANNED)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    error_layer = models.CharField(max_length=16, choices=ErrorLayer.choices, blank=True, default="")
    retryable = models.BooleanField(null=True, blank=True)
    verified = models.BooleanField(null=True, blank=True)
    verification = JSONField(null=True, blank=True)
    warnings = JSONField(default=list, blank=True)
    # Position in the run's completion order; LIFO compensation sorts by it, descending.
    completion_seq = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"], name="action_idempotency_per_tenant"
            ),
            models.UniqueConstraint(fields=["run", "seq"], name="action_seq_per_run"),
            models.CheckConstraint(
                condition=Q(
                    status__in=[
                        "planned",
                        "awaiting_approval",
                        "approved",
                        "rejected",
                        "running",
                        "succeeded",
                        "failed",
                        "unknown",
                        "compensating",
                        "compensated",
                        "compensation_failed",
                    ]
                ),
                name="action_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(risk__in=["low", "medium", "high", "critical"]), name="action_risk_valid"
            ),
            models.CheckConstraint(
                condition=Q(
                    action_class__in=[
                        "read_only",
                        "draft_only",
                        "internal_update",
                        "external_reversible",
                        "external_irreversible",
                    ]
                ),
                name="action_class_valid",
            ),
            models.CheckConstraint(condition=Q(attempts__gte=0), name="action_attempts_non_negative"),
        ]
        indexes = [
            models.Index(fields=["tenant", "tool", "-created_at"], name="action_tenant_tool"),
            models.Index(fields=["tenant", "target_id"], name="action_tenant_target"),
            models.Index(fields=["run", "-completion_seq"], name="action_run_completion"),
            models.Index(fields=["tenant", "status"], name="action_tenant_status"),
            # The newest gateway-recorded actions of a tenant, for the policy checks of
            # ``ledger.upstreams`` (a partial index: only the rows that carry a ``via``).
            models.Index(
                fields=["tenant", "-created_at"], name="action_via_recent", condition=Q(via__isnull=False)
            ),
            # ``per: agent`` limits: the agent's recorded, not rejected actions of a tool in a window
            # (``per: tenant`` ones use action_tenant_tool).
            models.Index(
                fields=["tenant", "tool", "owner", "created_at"],
                name="action_limit_owner",
                condition=~Q(status="rejected"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.tool}"


class Checkpoint(models.Model):
    class RecoveryMode(models.TextChoices):
        RESUME_OR_COMPENSATE = "resume_or_compensate", "Resume or compensate"
        RESUME_ONLY = "resume_only", "Resume only"
        COMPENSATE_ONLY = "compensate_only", "Compensate only"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_checkpoint_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="checkpoints")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    name = models.CharField(max_length=200)
    state = JSONField(default=dict, blank=True)
    completed_action_ids = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    pending_action_ids = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    requires_user_approval = models.BooleanField(default=False)
    recovery_mode = models.CharField(
        max_length=32, choices=RecoveryMode.choices, default=RecoveryMode.RESUME_OR_COMPENSATE
    )
    recovery_instructions = models.TextField(blank=True, default="")
    summary = models.TextField(blank=True, default="")
    trace_links = JSONField(default=list, blank=True)
    # The run's completion counter when the checkpoint was written: actions completed after it
    # make the checkpoint stale for a resume.
    completion_mark = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["run", "-created_at"], name="checkpoint_run_created")]
        constraints = [
            models.CheckConstraint(
                condition=Q(recovery_mode__in=["resume_or_compensate", "resume_only", "compensate_only"]),
                name="checkpoint_recovery_mode_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.name}"


# Statement level: a load that writes fifty policies moves the stamp once per statement, not per row.
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

    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.CASCADE)
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
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="tool_policies"
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
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="pauses")
    agent = models.CharField(max_length=200, blank=True, default="")
    tool = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_key = models.ForeignKey(
        AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    lifted_at = models.DateTimeField(null=True, blank=True)
    lifted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    lifted_by_key = models.ForeignKey(
        AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
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
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="compensators"
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


class IdempotencyRecord(models.Model):
    """A stored response for the API's Idempotency-Key header (per tenant, kept ≥ 24 h)."""

    class State(models.TextChoices):
        IN_FLIGHT = "in_flight", "In flight"
        COMPLETED = "completed", "Completed"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=500)
    request_hash = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.IN_FLIGHT)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "key"], name="idempotency_record_per_tenant")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_created")]

    def __str__(self) -> str:
        return f"{self.key} ({self.state})"


class Event(models.Model):
    """The append-only audit log. The database refuses UPDATE and DELETE (trigger), and each row
    carries a SHA-256 chained to the previous event of the same chain (a run, or a tenant's
    run-less events), so a row edited behind the trigger's back is detectable."""

    class ActorType(models.TextChoices):
        AGENT_KEY = "agent_key", "Agent key"
        USER = "user", "User"
        SYSTEM = "system", "System"

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="events")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.PROTECT, related_name="events")
    chain = models.CharField(max_length=64)
    kind = models.CharField(max_length=64)
    subject_type = models.CharField(max_length=32)
    subject_id = models.CharField(max_length=64)
    from_state = models.CharField(max_length=32, blank=True, default="")
    to_state = models.CharField(max_length=32, blank=True, default="")
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64, blank=True, default="")
    actor_label = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    data = JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["chain", "-id"], name="event_chain_latest"),
            models.Index(fields=["run", "id"], name="event_run"),
            models.Index(fields=["tenant", "-created_at"], name="event_tenant_created"),
            models.Index(fields=["subject_type", "subject_id"], name="event_subject"),
        ]
        triggers = [
            pgtrigger.Protect(name="event_append_only", operation=pgtrigger.Update | pgtrigger.Delete),
            # Row triggers do not see TRUNCATE; a statement trigger refuses it.
            pgtrigger.Trigger(
                name="event_no_truncate",
                operation=pgtrigger.Truncate,
                when=pgtrigger.Before,
                level=pgtrigger.Statement,
                func="RAISE EXCEPTION 'The audit log is append-only: TRUNCATE of % is refused', TG_TABLE_NAME;",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.kind} {self.subject_type}:{self.subject_id}"
