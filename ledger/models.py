"""The record: tenants, keys, runs, actions (the ledger), checkpoints and the audit log; the
policies (``ledger.policy_models``), the signed audit heads (``ledger.audit_models``) and the
shared vocabularies (``ledger.choices``) re-exported.

State fields here are written only by ``ledger.services`` (and, for the states a recovery
decision drives, by ``recovery.actions`` through the ledger's own transition functions).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from infra import ids
from infra.json_text import JSONField
from ledger.append_only import append_only_triggers
from ledger.audit_models import ArchivedRun, AuditSignCursor, SignedHead
from ledger.choices import RISK_ORDER, ActionClass, ApprovalMode, CompensationStrategy, Risk, max_risk
from ledger.policy_models import Compensator, Pause, PolicySet, PolicyStamp, StateReader, ToolPolicy

__all__ = [
    "RISK_ORDER",
    "Action",
    "ActionClass",
    "AgentKey",
    "ArchivedRun",
    "ApprovalMode",
    "AuditSignCursor",
    "Checkpoint",
    "CompensationStrategy",
    "Compensator",
    "Event",
    "IdempotencyRecord",
    "Membership",
    "Pause",
    "PolicySet",
    "PolicyStamp",
    "Risk",
    "Run",
    "SignedHead",
    "StateReader",
    "Tenant",
    "ToolPolicy",
    "max_risk",
]


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
    # Away (``ledger.away``): until when this person is away from this tenant, who covers for them
    # (another approver or admin of it), and since when. Away ends by itself at ``away_until``;
    # all three are set together and cleared together.
    away_until = models.DateTimeField(null=True, blank=True)
    away_delegate = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    away_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_one_role_per_tenant"),
            models.CheckConstraint(
                condition=Q(away_until__isnull=True) | ~Q(away_delegate=models.F("user")),
                name="membership_away_not_own_delegate",
            ),
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
        triggers = append_only_triggers("event", what="The audit log is")

    def __str__(self) -> str:
        return f"#{self.id} {self.kind} {self.subject_type}:{self.subject_id}"
