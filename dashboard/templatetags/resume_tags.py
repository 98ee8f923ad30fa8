"""Whether a resume reached its agent: the agent's last sign of life in words, and the "Resume
sent n min ago, not picked up" panel of the run page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import template

from infra.conf import saga
from infra.durations import duration_words
from ledger.models import Run
from recovery.actions import commands

register = template.Library()


@register.filter
def in_words(seconds: int | float | None) -> str:
    """A duration for a sentence: "40 seconds", "2 hours 5 minutes" (``infra.durations``)."""
    return duration_words(seconds)


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
