"""The decisions: recovery items, approvals (their grants: ``recovery.grant_models``), unwinds and
their steps, agent commands.

Every status here moves by ``ledger.transitions``'s compare-and-set: items, unwinds and steps over the
tables at the end of this module, the others over their owners' (``ledger.transitions`` names them).
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models
from django.db.models import Q

from infra import errors, ids, outbound
from infra.json_text import JSONField
from ledger.models import RISK_ORDER, Action, AgentKey, Checkpoint, Event, Risk, Run, Tenant
from recovery.grant_models import ApprovalGrant as ApprovalGrant


class RecoveryItem(models.Model):
    class Status(models.TextChoices):
        OPEN = "open", "Open"
        CLAIMED = "claimed", "Claimed"
        RESOLVED = "resolved", "Resolved"

    # What the queue shows by default, and what "the run's item" means: at most one per run.
    UNRESOLVED = (Status.OPEN, Status.CLAIMED)

    class Reason(models.TextChoices):
        FAILED = "failed", "Run failed"
        VERIFICATION_FAILED = "verification_failed", "Verification failed"
        AGENT_LOST = "agent_lost", "Agent lost (no heartbeat)"
        OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
        COMPENSATION_FAILED = "compensation_failed", "Compensation failed"
        STATE_DRIFT = "state_drift", "State drift"
        # An undo the compensator acknowledged whose value the reader did not read back as it was.
        NOT_RESTORED = "not_restored", "Undo not restored"
        MANUAL = "manual", "Manual"
        CANCELLED = "cancelled", "Run cancelled"

    class Resolution(models.TextChoices):
        RESUMED = "resumed", "Resumed"
        COMPENSATED = "compensated", "Compensated"
        CLOSED = "closed", "Closed"
        AUTO_COMPENSATED = "auto_compensated", "Auto-compensated"

    class Suggestion(models.TextChoices):
        RESUME = "resume", "Resume"
        COMPENSATE = "compensate", "Compensate"
        CLOSE = "close", "Close"
        RECONCILE = "reconcile", "Reconcile unknown outcomes first"
        REVIEW = "review", "Review manually"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_recovery_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="recovery_items")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="recovery_items")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OPEN)
    reason = models.CharField(max_length=32, choices=Reason.choices)
    failed_action = models.ForeignKey(
        Action, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    risk = models.CharField(max_length=16, choices=Risk.choices, default=Risk.LOW)
    suggested_resolution = models.CharField(
        max_length=16, choices=Suggestion.choices, default=Suggestion.REVIEW
    )
    error = models.TextField(blank=True, default="")
    # Groups similar failures in the queue: the failing tool plus a normalised error.
    signature = models.CharField(max_length=64, blank=True, default="")
    # What the queue's substring search matches (the failing tool and the run's request,
    # lower-cased), kept on the item so a trigram index over unresolved items serves the search
    # instead of a join of every unresolved item with its run and action. Set by
    # services.item_open_or_update, the one place an item's failed action is set.
    search_text = models.TextField(blank=True, default="", db_default="", editable=False)
    details = JSONField(default=dict, blank=True)
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=24, choices=Resolution.choices, blank=True, default="")
    resolution_note = models.TextField(blank=True, default="")
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolved_at = models.DateTimeField(null=True, blank=True)
    reopened_count = models.PositiveIntegerField(default=0)
    opened_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            # One unresolved item per run: a new failure updates it rather than duplicating it.
            models.UniqueConstraint(
                fields=["run"], condition=~Q(status="resolved"), name="recovery_one_open_per_run"
            ),
            models.CheckConstraint(
                condition=Q(status__in=["open", "claimed", "resolved"]), name="recovery_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(status="resolved", resolved_at__isnull=False) | ~Q(status="resolved"),
                name="recovery_resolved_has_time",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "-opened_at"], name="recovery_queue"),
            models.Index(fields=["status", "-opened_at"], name="recovery_status_opened"),
            models.Index(fields=["tenant", "status", "risk", "-opened_at"], name="recovery_queue_risk"),
            models.Index(fields=["tenant", "status", "reason", "-opened_at"], name="recovery_queue_reason"),
            models.Index(fields=["tenant", "signature"], name="recovery_signature"),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.reason}, {self.status})"


class Unwind(models.Model):
    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        PAUSED = "paused", "Paused (waiting for a human)"
        COMPLETED = "completed", "Completed"
        FAILED = "failed", "Finished with failures"
        CANCELLED = "cancelled", "Cancelled"

    class OnFailure(models.TextChoices):
        ALERT_AND_CONTINUE = "alert_and_continue", "Alert and continue"
        HALT = "halt", "Halt"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_unwind_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="unwinds")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="unwinds")
    item = models.ForeignKey(
        RecoveryItem, null=True, blank=True, on_delete=models.SET_NULL, related_name="unwinds"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    on_failure = models.CharField(
        max_length=24, choices=OnFailure.choices, default=OnFailure.ALERT_AND_CONTINUE
    )
    automatic = models.BooleanField(default=False)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_key = models.ForeignKey(
        AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True, default="")
    # The dry-run plan the operator confirmed, frozen: what was shown is what runs.
    plan = JSONField(default=dict, blank=True)
    # The RQ job carrying the unwind's latest advance. Not a state: the sweeper asks Redis about
    # it before advancing an unwind that has nothing in flight (recovery.sweeper).
    job_id = models.CharField(max_length=100, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One active unwind per run: two concurrent Compensate clicks produce one unwind.
            models.UniqueConstraint(
                fields=["run"],
                condition=Q(status__in=["running", "paused"]),
                name="unwind_one_active_per_run",
            ),
        ]
        indexes = [models.Index(fields=["status", "-created_at"], name="unwind_status")]

    def __str__(self) -> str:
        return self.id


class UnwindStep(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"
        DRIFTED = "drifted", "Drifted"
        SKIPPED = "skipped", "Skipped"

    FINISHED = (Status.DONE, Status.FAILED, Status.DRIFTED, Status.SKIPPED)

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_step_id, editable=False)
    unwind = models.ForeignKey(Unwind, on_delete=models.CASCADE, related_name="steps")
    action = models.ForeignKey(Action, on_delete=models.CASCADE, related_name="unwind_steps")
    # 0 is the newest completed action: steps run in ascending position (LIFO).
    position = models.PositiveIntegerField()
    tool = models.CharField(max_length=200, blank=True, default="")
    args = JSONField(null=True, blank=True)
    strategy = models.CharField(max_length=16, blank=True, default="")
    requires_approval = models.BooleanField(default=False)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    # Stable across retries and re-enqueues: the compensator sees the same key every time.
    idempotency_key = models.CharField(max_length=200)
    # Lease with a fencing token: a worker that lost its lease cannot record an outcome.
    lease_token = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    job_id = models.CharField(max_length=100, blank=True, default="")
    error = models.TextField(blank=True, default="")
    result = JSONField(null=True, blank=True)
    # The reader's checks (the action's policy ``before``, recovery.readers): whether the value read
    # back after the undo equals the before-image (None: no reader, or not done yet), and what the
    # checks read: {"now": value before the undo, "read_back": value after it, "differences": [...],
    # "reads": [{"phase": "drift"|"verify", "tool", "kind", "ok", "error", "at", "ms"}]}.
    verified = models.BooleanField(null=True, blank=True)
    read_checks = JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["unwind", "position"]
        constraints = [
            models.UniqueConstraint(fields=["unwind", "position"], name="step_position_per_unwind"),
            models.CheckConstraint(condition=Q(attempts__gte=0), name="step_attempts_non_negative"),
            models.CheckConstraint(
                condition=Q(
                    status__in=[
                        "pending",
                        "awaiting_approval",
                        "queued",
                        "running",
                        "done",
                        "failed",
                        "drifted",
                        "skipped",
                    ]
                ),
                name="step_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "lease_expires_at"], name="step_status_lease"),
        ]

    def __str__(self) -> str:
        return f"{self.id} #{self.position} {self.tool}"


class Approval(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        EXPIRED = "expired", "Expired"

    class Kind(models.TextChoices):
        ACTION = "action", "Forward action"
        COMPENSATION = "compensation", "Compensation step"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_approval_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="approvals")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    action = models.ForeignKey(Action, on_delete=models.CASCADE, related_name="approvals")
    step = models.OneToOneField(
        UnwindStep, null=True, blank=True, on_delete=models.CASCADE, related_name="approval"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    risk = models.CharField(max_length=16, choices=Risk.choices)
    tool = models.CharField(max_length=200)
    # Exactly what the approver is shown; the decision binds to its hash.
    args = JSONField(null=True, blank=True)
    args_hash = models.CharField(max_length=64)
    approved_args = JSONField(null=True, blank=True)
    approved_args_hash = models.CharField(max_length=64, blank=True, default="")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_key = models.ForeignKey(
        AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_by_key = models.ForeignKey(
        AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    expires_at = models.DateTimeField()
    # How many distinct people must grant it (the policy's or rule's ``approvers``); the first
    # N-1 grants are ApprovalGrant rows and leave it pending (recovery.transitions.approvals.approval_decide).
    approvers_required = models.PositiveSmallIntegerField(default=1, db_default=1)
    # An approval asked again after this one expired or was rejected (the new one links back).
    previous = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="asked_again"
    )
    # When approvers were reminded of it (half its window, once per window: set by a
    # compare-and-set in recovery.approval_deadlines.approval_remind, whichever sweeper gets there
    # first; cleared when it escalates, so the new approvers are reminded in their window too).
    reminded_at = models.DateTimeField(null=True, blank=True)
    # When the reminder is due: half way through the current window (recovery.approval_deadlines).
    remind_at = models.DateTimeField(null=True, blank=True)
    # The deadline of the policy that asked for it (ledger.policies.deadlines): the window's
    # length (None: an approval from before deadlines per policy), what a timeout does, and to
    # whom it escalates; ``escalated_at`` once it did (then only ``escalate_to`` decides it, and
    # its next timeout expires it).
    timeout_s = models.PositiveIntegerField(null=True, blank=True)
    on_timeout = models.CharField(max_length=16, default="reject", db_default="reject")
    escalate_to = models.CharField(max_length=150, blank=True, default="", db_default="")
    escalated_at = models.DateTimeField(null=True, blank=True)
    # Handed over (``recovery.transitions.delegation``): the person its escalation named, who was
    # away and may still decide it, and when it went to their delegate (``escalate_to`` from then).
    delegated_from = models.CharField(max_length=150, blank=True, default="", db_default="")
    delegated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["pending", "approved", "rejected", "expired"]),
                name="approval_status_valid",
            ),
            models.UniqueConstraint(
                fields=["action"],
                condition=Q(kind="action", status="pending"),
                name="approval_one_pending_per_action",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "created_at"], name="approval_inbox"),
            models.Index(fields=["status", "expires_at"], name="approval_expiry"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.tool} ({self.status})"


class AgentCommand(models.Model):
    class Kind(models.TextChoices):
        RESUME = "resume", "Resume"
        CANCEL = "cancel", "Cancel"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        ACKED = "acked", "Acknowledged"
        # Withdrawn before the agent acknowledged it: the run ended, was cancelled or failed again
        # (recovery.actions.commands.commands_cancel_pending). An agent pulls only pending commands.
        CANCELLED = "cancelled", "Cancelled"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_command_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agent_commands")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    checkpoint = models.ForeignKey(
        Checkpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    acked_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    # When the sweeper told people that the agent had not acknowledged it in time (once per command).
    overdue_notified_at = models.DateTimeField(null=True, blank=True)
    # Push delivery to the run's resume_url (when set); pull delivery works regardless.
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_attempts = models.PositiveIntegerField(default=0)
    delivery_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["run", "status"], name="command_run_status")]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["pending", "acked", "cancelled"]), name="command_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.kind} ({self.status})"

    def issued_by(self) -> str:
        """Who issued it, as the audit log names them (a user, or an operator's API key)."""
        label = (
            Event.objects.filter(run_id=self.run_id, kind=f"command.{self.kind}", subject_id=self.pk)
            .values_list("actor_label", flat=True)
            .first()
        )
        return label or (self.created_by.get_username() if self.created_by else "an operator")


# --- Notifications: channels per tenant, the outbox (the Slack app: recovery.slack_models) -----


class NotificationEvent(models.TextChoices):
    APPROVAL_REQUESTED = "approval.requested", "Approval requested"
    APPROVAL_REMINDER = "approval.reminder", "Approval reminder (half its window)"
    APPROVAL_ESCALATED = "approval.escalated", "Approval escalated (nobody decided in time)"
    APPROVAL_EXPIRED = "approval.expired", "Approval expired (timed out)"
    RECOVERY_OPENED = "recovery.opened", "Run in the recovery queue"
    STEP_FAILED = "step.failed", "Compensation step failed"
    UNWIND_FINISHED = "unwind.finished", "Unwind finished"
    COMMAND_OVERDUE = "command.overdue", "Resume not picked up"
    TEST = "notification.test", "Test notification"
    # What became of something already announced: sent only to the PagerDuty channels that paged
    # about it (recovery.notifications.pagerduty), never to the other kinds nor the environment's.
    APPROVAL_GRANTED = "approval.granted", "Approval granted by one of several approvers"
    APPROVAL_DECIDED = "approval.decided", "Approval decided (approved, rejected or withdrawn)"
    RECOVERY_CLAIMED = "recovery.claimed", "Recovery item taken up (an unwind started)"
    RECOVERY_RESOLVED = "recovery.resolved", "Recovery item resolved"


# What became of an announced approval or item (see above).
FOLLOW_UP_EVENTS = frozenset(
    {"approval.granted", "approval.decided", "recovery.claimed", "recovery.resolved"}
)

# What a channel chooses from, and what one that chose none gets (a test is sent whatever it chose).
CHANNEL_EVENTS = [
    e for e in NotificationEvent.values if e != NotificationEvent.TEST and e not in FOLLOW_UP_EVENTS
]

# What a PagerDuty channel chooses from (none chosen: all): approvals nearing their deadline (the
# reminder at half the window) or escalating, recovery items, stuck undo (a failed or drifted step).
PAGEABLE_EVENTS: list[str] = ["approval.reminder", "approval.escalated", "recovery.opened", "step.failed"]

# A PagerDuty Events API v2 integration key ("routing key"): 32 letters and digits.
ROUTING_KEY_PATTERN = re.compile(r"[A-Za-z0-9]{32}")


class NotificationChannel(models.Model):
    """Where a tenant's notifications go. ``target``: comma-separated e-mail addresses, or the
    webhook / Slack / Teams webhook URL (checked by ``infra.outbound.check_url`` when saved and
    again before each send), or a PagerDuty channel's Events API endpoint ("": the installation's,
    ``SAGA_PAGERDUTY_EVENTS_URL``). ``secret`` signs webhook bodies (the compensator scheme); a
    PagerDuty channel's is its integration's routing key. Neither is ever shown back."""

    class Kind(models.TextChoices):
        EMAIL = "email", "E-mail"
        WEBHOOK = "webhook", "Signed webhook"
        SLACK = "slack", "Slack incoming webhook"
        PAGERDUTY = "pagerduty", "PagerDuty (Events API v2)"
        TEAMS = "teams", "Microsoft Teams (Workflows webhook)"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_channel_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="notification_channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=2000, blank=True)
    secret = models.CharField(max_length=500, blank=True, default="")
    events = JSONField(default=list, blank=True)
    min_risk = models.CharField(max_length=16, choices=Risk.choices, default=Risk.LOW)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="channel_name_per_tenant"),
            models.CheckConstraint(
                condition=Q(kind__in=["email", "webhook", "slack", "pagerduty", "teams"]),
                name="channel_kind_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    def clean(self) -> None:
        # The one check of a channel's destination, for the dashboard's form, the Django admin and
        # the services alike (they call full_clean).
        if self.kind == self.Kind.EMAIL:
            addresses = [a.strip() for a in self.target.split(",") if a.strip()]
            if not addresses:
                raise ValidationError({"target": "Give at least one e-mail address."})
            for address in addresses:
                try:
                    validate_email(address)
                except ValidationError:
                    raise ValidationError({"target": f"{address!r} is not an e-mail address."}) from None
            self.target = ", ".join(addresses)
        elif self.kind in (self.Kind.WEBHOOK, self.Kind.SLACK, self.Kind.TEAMS):
            try:
                outbound.check_url(self.target.strip(), field="URL", owner=outbound.owner_of(self.tenant_id))
            except errors.UrlNotAllowed as exc:
                # The tenant's admin configures the installation's notifications: told why (an
                # agent choosing a resume_url is told only that it is not allowed).
                raise ValidationError({"target": exc.operator_message or exc.message}) from None
            self.target = self.target.strip()
        elif self.kind == self.Kind.PAGERDUTY:
            self._clean_pagerduty()
        choices = self.choosable_events()
        unknown = [e for e in self.events if e not in choices] if isinstance(self.events, list) else [1]
        if unknown and self.kind == self.Kind.PAGERDUTY:
            raise ValidationError(
                {"events": f"A PagerDuty channel pages only about {', '.join(choices)}; not {unknown}."}
            )
        if unknown:
            raise ValidationError({"events": f"Unknown events: {unknown}."})

    def _clean_pagerduty(self) -> None:
        self.secret = self.secret.strip()
        if not ROUTING_KEY_PATTERN.fullmatch(self.secret):
            raise ValidationError(
                {
                    "secret": "The routing key is the 32-character Integration Key of an Events API "
                    "v2 integration (PagerDuty: Service → Integrations)."
                }
            )
        self.target = self.target.strip()
        if self.target:
            # A tenant's own endpoint (another service region, say): where the guard lets a
            # webhook go, and only over TLS, since every event carries the routing key.
            try:
                outbound.check_url(
                    self.target, field="URL", tls=True, owner=outbound.owner_of(self.tenant_id)
                )
            except errors.UrlNotAllowed as exc:
                raise ValidationError({"target": exc.operator_message or exc.message}) from None

    def choosable_events(self) -> list[str]:
        return PAGEABLE_EVENTS if self.kind == self.Kind.PAGERDUTY else CHANNEL_EVENTS

    def wants(self, event: str, risk: str) -> bool:
        """Whether this channel takes ``event`` at ``risk`` (a test always goes through); one that
        chose none takes every one it could choose (``FOLLOW_UP_EVENTS``: never asked here)."""
        if event == NotificationEvent.TEST:
            return True
        chosen = event in self.events if self.events else event in self.choosable_events()
        return chosen and RISK_ORDER[Risk(risk or Risk.LOW)] >= RISK_ORDER[Risk(self.min_risk)]


class Notification(models.Model):
    """The outbox: one row per (event, channel), written in the transaction of the event that
    causes it; delivered by a worker job with retries (``recovery.notifications``), re-enqueued by
    the sweeper while undelivered. ``channel`` is None for an environment channel (``env_target``:
    ``email`` or the webhook URL from SAGA_NOTIFY_WEBHOOKS) and for an e-mail to the people an
    approval was escalated to (``env_target`` ``PEOPLE``, the addresses in ``context["recipients"]``)."""

    PEOPLE = "people"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENDING = "sending", "Sending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed"
        # Not sent: what it announced was over before it went out (an overdue resume picked up,
        # an approval decided before its reminder).
        DROPPED = "dropped", "Dropped (no longer relevant)"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_notification_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="notifications")
    channel = models.ForeignKey(
        NotificationChannel, null=True, blank=True, on_delete=models.SET_NULL, related_name="notifications"
    )
    channel_name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=NotificationChannel.Kind.choices)
    env_target = models.CharField(max_length=2000, blank=True, default="")
    event = models.CharField(max_length=32, choices=NotificationEvent.choices)
    subject_id = models.CharField(max_length=40)
    run_id = models.CharField(max_length=40, blank=True, default="")
    risk = models.CharField(max_length=16, choices=Risk.choices, default=Risk.LOW)
    # The webhook body, exactly as sent ({event, tenant, id, run_id, summary, url, created_at}).
    body = JSONField(default=dict)
    # What e-mail and Slack messages say besides the body (tool, reason, expiry, approval id).
    context = JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=10)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Claimed by one worker at a time: status sending, a fencing token and a lease.
    lease_token = models.PositiveIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    job_id = models.CharField(max_length=100, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    # Every attempt: [{"at", "outcome", "error", "status_code"}], the last few kept.
    history = JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["pending", "sending", "delivered", "failed", "dropped"]),
                name="notification_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="notification_tenant_recent"),
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status__in=["pending", "sending"]),
                name="notification_undelivered",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.event} → {self.channel_name} ({self.status})"


# --- State machines (checked by ledger.transitions.compare_and_set) ---------------------------

ITEM_TRANSITIONS: dict[str, set[str]] = {
    # Resume and close resolve an open item; an unwind claims it first and resolves it when done,
    # or hands it back (open) naming what is left.
    RecoveryItem.Status.OPEN: {RecoveryItem.Status.CLAIMED, RecoveryItem.Status.RESOLVED},
    RecoveryItem.Status.CLAIMED: {RecoveryItem.Status.RESOLVED, RecoveryItem.Status.OPEN},
    RecoveryItem.Status.RESOLVED: set(),
}

UNWIND_TRANSITIONS: dict[str, set[str]] = {
    # cancelled: an operator stopped it between steps (recovery.unwinds.unwind_stop).
    Unwind.Status.RUNNING: {
        Unwind.Status.PAUSED,
        Unwind.Status.COMPLETED,
        Unwind.Status.FAILED,
        Unwind.Status.CANCELLED,
    },
    Unwind.Status.PAUSED: {Unwind.Status.RUNNING, Unwind.Status.CANCELLED},
    # An operator's retry or skip of a failed step picks a finished-with-failures unwind up again.
    Unwind.Status.FAILED: {Unwind.Status.RUNNING},
    Unwind.Status.COMPLETED: set(),
    Unwind.Status.CANCELLED: set(),
}


class CompensatorCheck(models.Model):
    """A tenant admin's check of a registered compensator from the dashboard: only the protocol's
    harmless cases (recovery.compensator_checks), never a validly signed call. ``fingerprint``:
    where the compensator pointed when checked; a check of another URL is no check of this one."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="compensator_checks")
    tool = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64)
    ok = models.BooleanField()
    results = JSONField(default=list)  # [{id, title, required, verdict, status, detail}]
    checked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    checked_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "tool", "-checked_at"], name="compcheck_latest")]

    def __str__(self) -> str:
        return f"{self.tool}: {'passed' if self.ok else 'failed'} at {self.checked_at:%Y-%m-%d %H:%M}"


_Step = UnwindStep.Status
STEP_TRANSITIONS: dict[str, set[str]] = {
    # A step is queued for a job of its own, or claimed straight from pending by the worker that
    # advanced the unwind; one that needs a person waits for its approval first. One whose args
    # the policy's templates cannot fill from the forward action fails without running.
    # A stopped unwind puts the steps it had not started back to pending (an approval asked for is
    # withdrawn) and fails one that was waiting to be retried (its compensator may have acted).
    _Step.PENDING: {_Step.AWAITING_APPROVAL, _Step.QUEUED, _Step.RUNNING, _Step.FAILED},
    _Step.AWAITING_APPROVAL: {_Step.QUEUED, _Step.FAILED, _Step.PENDING},
    _Step.QUEUED: {_Step.RUNNING, _Step.PENDING, _Step.FAILED},
    # Back to queued: a retry after a transient failure, or a lease that expired.
    _Step.RUNNING: {_Step.QUEUED, _Step.DONE, _Step.FAILED, _Step.DRIFTED},
    # Awaiting approval again: its approval expired or was rejected and was asked again.
    _Step.FAILED: {_Step.PENDING, _Step.SKIPPED, _Step.AWAITING_APPROVAL},
    _Step.DRIFTED: {_Step.PENDING, _Step.SKIPPED},
    _Step.DONE: set(),
    _Step.SKIPPED: set(),
}


# Models of this app in modules of their own (a tenant's Slack app and its links; the used e-mail
# decision links), imported here.
from recovery.email_link_models import EmailLinkUse as EmailLinkUse  # noqa: E402
from recovery.slack_models import SlackApp as SlackApp  # noqa: E402
from recovery.slack_models import SlackLinkCode as SlackLinkCode  # noqa: E402
from recovery.slack_models import SlackUserLink as SlackUserLink  # noqa: E402
