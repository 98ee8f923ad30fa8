"""Whether a resume reached its agent: the agent's last sign of life in words, and the "Resume
sent n min ago, not picked up" panel of the run page."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ledger.conf import saga
from ledger.models import Run
from recovery import commands

register = template.Library()


@register.filter
def in_words(seconds: int | float | None) -> str:
    """A duration for a sentence: "40 seconds", "1 minute", "6 minutes", "2 hours 5 minutes"."""
    if seconds is None:
        return "—"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} second{'s' if whole != 1 else ''}"
    hours, rest = divmod(whole, 3600)
    days, hours = divmod(hours, 24)
    minutes = rest // 60
    parts = [(days, "day"), (hours, "hour"), (minutes, "minute")]
    shown = [f"{n} {unit}{'s' if n != 1 else ''}" for n, unit in parts if n][:2]
    return " ".join(shown)


@register.inclusion_tag("dashboard/_resume_wait.html")
def resume_wait(run: Run) -> dict[str, Any]:
    """The run's resume command its agent has not acknowledged yet (none: nothing is shown)."""
    wait = commands.resume_waiting(run=run)
    if wait is None:
        return {"wait": None}
    pulse = commands.agent_pulse(run=run)
    return {
        "run": run,
        "wait": wait,
        "pulse": pulse,
        "ack_timeout_s": saga().resume_ack_timeout_s,
        # When the lost-agent monitor gives up on it: its silence counts from the resume.
        "lost_at": max(pulse.heard_at, wait.command.created_at) + timedelta(seconds=pulse.timeout_s),
    }


@register.filter
def ago_in_words(when: datetime | str | None) -> str:
    """How long ago ``when`` (a datetime, or the ISO string an item's details keep) was, in words."""
    moment = parse_datetime(when) if isinstance(when, str) else when
    if moment is None:
        return "—"
    return in_words(max(0, (timezone.now() - moment).total_seconds()))
