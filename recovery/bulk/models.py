"""A bulk decision's tables: the operation and one row per item it matched (``recovery.bulk``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from infra import ids
from infra.json_text import JSONField
from ledger.models import AgentKey, Tenant

# At most this many item errors are kept on the operation (the rest are counted in ``failed``).
ERRORS_KEPT = 50


class BulkOperation(models.Model):
    """One operator's decision over every item a queue filter matched when it started. The items
    are snapshotted (``BulkItem``) at the start; workers decide them in parallel lanes, each item in
    its own transaction, through the ordinary decision services, with the requesting operator as actor."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        ABORTED = "aborted", "Aborted"

    class Action(models.TextChoices):
        COMPENSATE = "compensate", "Compensate"
        CLOSE = "close", "Close"
        RESUME = "resume", "Resume"
        CANCEL = "cancel", "Cancel the run"

    id = models.CharField(primary_key=True, max_length=40, default=ids.new_bulk_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="bulk_operations")
    action = models.CharField(max_length=16, choices=Action.choices)
    # The queue filter as started (``recovery.selectors.QueueFilter.as_dict``).
    filter = JSONField(default=dict)
    reason = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    # Who asked: a dashboard user or an operator key; each item's decision is theirs.
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_key = models.ForeignKey(
        AgentKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_by_label = models.CharField(max_length=200)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)
    # The first ERRORS_KEPT failures: [{"item_id", "run_id", "code", "message"}].
    errors = JSONField(default=list, blank=True)
    abort_reason = models.TextField(blank=True, default="")
    aborted_by_label = models.CharField(max_length=200, blank=True, default="")
    # The RQ job carrying its first lane's next chunk (``jobs[0]``). Not a state: the periodic
    # sweep asks Redis about it before handing a running bulk that has not moved to a job again.
    job_id = models.CharField(max_length=100, blank=True, default="")
    # Every lane's job (``recovery.actions.bulk_worker``: the lanes decide in parallel); empty for
    # a bulk started before lanes, whose one lane is ``job_id``.
    jobs = JSONField(default=list, db_default=[], blank=True)
    # Why it stopped when the system stopped it ("": an operator aborted it, or it did not stop):
    # ``authority_lost``, its starter no longer had the right to decide (``abort_reason`` says how).
    abort_code = models.CharField(max_length=32, blank=True, default="", db_default="")
    started_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=["running", "finished", "aborted"]), name="bulk_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(action__in=["compensate", "close", "resume", "cancel"]), name="bulk_action_valid"
            ),
            models.CheckConstraint(
                condition=Q(total__gte=F("done") + F("failed") + F("skipped")),
                name="bulk_counts_within_total",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "-started_at"], name="bulk_tenant_recent"),
            models.Index(fields=["updated_at"], condition=Q(status="running"), name="bulk_running"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.action} ({self.status})"

    @property
    def decided(self) -> int:
        return self.done + self.failed + self.skipped


# A bulk runs until its last item is decided (finished), or until an operator aborts it or its
# starter loses the right to carry it on (aborted). Each move is under the operation's row lock.
BULK_TRANSITIONS: dict[str, set[str]] = {
    BulkOperation.Status.RUNNING: {BulkOperation.Status.FINISHED, BulkOperation.Status.ABORTED},
    BulkOperation.Status.FINISHED: set(),
    BulkOperation.Status.ABORTED: set(),
}


class BulkItem(models.Model):
    """One matched item: its state when the bulk started (an item changed since is skipped, never
    forced) and its outcome, written in the same transaction as its decision, so a worker killed
    mid-bulk neither loses nor repeats one."""

    class Outcome(models.TextChoices):
        PENDING = "pending", "Pending"
        DONE = "done", "Decided"
        FAILED = "failed", "Refused"
        SKIPPED = "skipped", "Skipped (changed since the start)"

    bulk = models.ForeignKey(BulkOperation, on_delete=models.CASCADE, related_name="items")
    item = models.ForeignKey("recovery.RecoveryItem", on_delete=models.CASCADE, related_name="+")
    run_id = models.CharField(max_length=40)
    position = models.PositiveIntegerField()
    seen_status = models.CharField(max_length=16)
    seen_updated_at = models.DateTimeField()
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.PENDING)
    code = models.CharField(max_length=64, blank=True, default="")
    message = models.TextField(blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    # The lane that claimed it and until when (a lease: once it runs out, a lane killed with it
    # claimed loses it to the next lane that looks). Decided only under its claim.
    claimed_by = models.CharField(max_length=40, blank=True, default="", db_default="")
    claimed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["bulk", "position"]
        constraints = [
            models.UniqueConstraint(fields=["bulk", "item"], name="bulk_item_once"),
            models.CheckConstraint(
                condition=Q(outcome__in=["pending", "done", "failed", "skipped"]),
                name="bulk_item_outcome_valid",
            ),
        ]
        indexes = [
            models.Index(
                fields=["bulk", "position"], condition=Q(outcome="pending"), name="bulk_item_pending"
            ),
            models.Index(fields=["run_id"], name="bulk_item_run"),
        ]

    def __str__(self) -> str:
        return f"{self.bulk_id}/{self.item_id} ({self.outcome})"


# An item's outcome is written once, in the transaction of its decision (or of the failure that
# stopped it), while it is still pending.
BULK_ITEM_OUTCOMES: dict[str, set[str]] = {
    BulkItem.Outcome.PENDING: {BulkItem.Outcome.DONE, BulkItem.Outcome.FAILED, BulkItem.Outcome.SKIPPED},
    BulkItem.Outcome.DONE: set(),
    BulkItem.Outcome.FAILED: set(),
    BulkItem.Outcome.SKIPPED: set(),
}
