"""Approval deadlines, as the periodic sweeps keep them (API.md, "Approval deadlines per policy"):
each approval carries its policy's window (``timeout_s``), what a timeout does (``on_timeout``)
and to whom it escalates (``escalate_to``), set when it is asked for (``recovery.transitions.approvals``).

- **Reminder**: once per window, half way through it (``remind_at``), to the tenant's channels
  that take ``approval.reminder``.
- **Escalation** (``on_timeout: escalate``, once): at the deadline, only ``escalate_to`` decides it
  from then on, with a fresh window of the same length from the sweep that escalated it; the new
  approvers are told once (``approval.escalated``), and reminded half way through their window.
- **Hand-over**: escalated to a person who is away (``ledger.away``), it goes on to whoever covers
  for them, in the same step (``recovery.transitions.delegation``), and they are the ones told.
- **Expiry** (``reject``, or a second timeout): the approval becomes ``expired`` with reason
  ``timed_out`` and what it gated is refused (``recovery.actions.periodic``), announced as
  ``approval.expired``.

Each step is one compare-and-set (or a row lock taken with SKIP LOCKED) in the transaction that
writes its audit event and its outbox rows: of two sweepers (or a sweeper and a worker that died
half way), one does it and the other finds it done, so every notification goes out once. A
decision takes the same row lock (``approvals.approval_decide``), so an approval decided just as
it times out is either decided or timed out, never both.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q, QuerySet

from ledger.audit import Actor, audit_record
from recovery.models import Approval
from recovery.notifications import outbox
from recovery.transitions import delegation
from recovery.transitions.approvals import deadline_window, escalates_now_q, escalation_emails

DEADLINE = Actor.system("approval-deadline")


def reminder_due_q(*, now: datetime) -> Q:
    """Pending, not reminded in this window, and past its half (``remind_at``; an approval asked
    for before reminders were stored computes it from its creation) — and not past its deadline:
    that one is swept, not reminded."""
    return Q(status=Approval.Status.PENDING, reminded_at__isnull=True, expires_at__gt=now) & (
        Q(remind_at__lte=now) | Q(remind_at__isnull=True, legacy_remind_at__lte=now)
    )


def approvals_due_for_reminder(*, now: datetime, limit: int | None = None) -> list[str]:
    """The approvals to remind now, at most ``limit`` of them (a sweep's batch; the next takes the
    rest: a reminded one is not due again)."""
    due = reminders_due(now=now).order_by("created_at").values_list("pk", flat=True)
    return list(due[:limit] if limit is not None else due)


def reminders_due(*, now: datetime) -> QuerySet[Approval]:
    """The approvals to remind now (``reminder_due_q``), unordered."""
    half = ExpressionWrapper((F("expires_at") - F("created_at")) / 2, output_field=DurationField())
    return Approval.objects.annotate(legacy_remind_at=F("created_at") + half).filter(reminder_due_q(now=now))


@transaction.atomic
def approval_remind(*, approval_id: str, now: datetime) -> Approval | None:
    """Remind the approvers of a pending approval, once in its window: ``reminded_at`` is set by
    compare-and-set in the transaction that writes the reminder's outbox rows and its audit event,
    so of two sweepers one reminds and the other finds it done (None)."""
    if (
        Approval.objects.filter(
            pk=approval_id, status=Approval.Status.PENDING, reminded_at__isnull=True, expires_at__gt=now
        ).update(reminded_at=now)
        != 1
    ):
        return None
    approval = Approval.objects.select_related("tenant", "run").get(pk=approval_id)
    audit_record(
        tenant=approval.tenant,
        run=approval.run,
        actor=DEADLINE,
        kind="approval.reminded",
        subject=approval,
        from_state=approval.status,
        to_state=approval.status,
        data={
            "expires_at": approval.expires_at.isoformat(),
            **({"escalated_to": approval.escalate_to} if approval.escalated_at else {}),
        },
    )
    outbox.notify_approval_reminder(approval)
    return approval


def approvals_past_deadline(*, now: datetime) -> list[str]:
    """The pending approvals whose deadline has passed (to escalate or expire), oldest first."""
    return list(
        Approval.objects.filter(status=Approval.Status.PENDING, expires_at__lte=now)
        .order_by("expires_at")
        .values_list("pk", flat=True)
    )


def approval_escalate(*, approval_id: str, now: datetime) -> Approval | None:
    """pending past its deadline, ``on_timeout: escalate``, not escalated yet → escalated: from now
    on only ``escalate_to`` decides it, within a fresh window of the same length from ``now``;
    audited, and the new approvers are told. None when it is not one to escalate now (decided,
    escalated already, or another sweeper holds it). The caller holds the transaction."""
    approval = (
        Approval.objects.select_for_update(skip_locked=True, of=("self",))
        .filter(escalates_now_q(), pk=approval_id, status=Approval.Status.PENDING, expires_at__lte=now)
        .select_related("run__tenant")
        .first()
    )
    if approval is None:
        return None
    missed = approval.expires_at
    timeout_s = approval.timeout_s or int((approval.expires_at - approval.created_at).total_seconds())
    window = deadline_window(now=now, timeout_s=max(1, timeout_s))
    approval.escalated_at = now
    approval.expires_at = window["expires_at"]
    approval.remind_at = window["remind_at"]
    # The new approvers get their own reminder, half way through their window.
    approval.reminded_at = None
    approval.save(update_fields=["escalated_at", "expires_at", "remind_at", "reminded_at"])
    approval.tenant = approval.run.tenant
    audit_record(
        tenant=approval.run.tenant,
        run=approval.run,
        actor=DEADLINE,
        kind="approval.escalated",
        subject=approval,
        from_state=approval.status,
        to_state=approval.status,
        reason="nobody decided before the approval deadline",
        data={
            "escalate_to": approval.escalate_to,
            "missed_deadline": missed.isoformat(),
            "expires_at": approval.expires_at.isoformat(),
            "timeout_s": timeout_s,
        },
    )
    # Escalated to a person who is away: to whoever covers for them, from now (the hand-over).
    cover = delegation.approval_hand_over(approval, now=now, actor=DEADLINE, tell=False)
    outbox.notify_approval_escalated(
        approval,
        missed=missed,
        emails=escalation_emails(approval, now=now),
        away_until=cover.until if cover is not None else None,
    )
    return approval
