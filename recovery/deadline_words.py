"""An approval's deadline in words, the same on the inbox card, in a notification and in Slack:
"decide by 14:05 UTC (in 12 minutes)", what happens then, and whether it was escalated."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from infra.durations import duration_words
from recovery.models import Approval


def span_words(delta: timedelta) -> str:
    """A span in its largest unit, rounded: ``12 minutes`` (for 11 min 59 s), ``1 hour``, ``3 days``."""
    return duration_words(max(0.0, delta.total_seconds()), parts=1, rounded=True)


def clock(moment: datetime, now: datetime) -> str:
    """``14:05 UTC``, with the date when it is not today's (UTC)."""
    utc = moment.astimezone(UTC)
    if utc.date() == now.astimezone(UTC).date():
        return f"{utc:%H:%M} UTC"
    return f"{utc:%Y-%m-%d %H:%M} UTC"


def decide_by(approval: Approval, now: datetime | None = None) -> str:
    """``decide by 14:05 UTC (in 12 minutes)``, or ``the deadline passed at 14:05 UTC`` (the
    sweep has not reached it yet: nobody can decide it any more)."""
    now = now or timezone.now()
    if approval.expires_at <= now:
        return f"the deadline passed at {clock(approval.expires_at, now)}"
    return f"decide by {clock(approval.expires_at, now)} (in {span_words(approval.expires_at - now)})"


def escalated_words(approval: Approval, now: datetime | None = None) -> str:
    """``escalated to admin at 13:05 UTC: nobody decided in time`` ("" when not escalated)."""
    if approval.escalated_at is None:
        return ""
    return (
        f"escalated to {approval.escalate_to} at {clock(approval.escalated_at, now or timezone.now())}: "
        "nobody decided in time"
    )


def then_words(approval: Approval) -> str:
    """What the deadline does: ``then it is rejected`` or ``then it goes to admin``."""
    if approval.on_timeout == "escalate" and approval.escalated_at is None and approval.escalate_to:
        return f"then it goes to {approval.escalate_to}"
    return "then it is rejected"


def deadline_line(approval: Approval, now: datetime | None = None) -> str:
    """One line for a message: ``Decide by 14:05 UTC (in 12 minutes); then it is rejected.``, with
    the escalation first when there was one."""
    now = now or timezone.now()
    text = f"{decide_by(approval, now)}; {then_words(approval)}."
    if escalated := escalated_words(approval, now):
        text = f"{escalated[0].upper()}{escalated[1:]}. {text[0].upper()}{text[1:]}"
        return text
    return text[0].upper() + text[1:]


def escalation_who_words(escalate_to: str) -> str:
    """Who decides an escalated approval, in words."""
    if escalate_to == "admin":
        return "an admin of the tenant"
    if escalate_to == "approver":
        return "an approver or admin of the tenant"
    return escalate_to
