"""The pause banner: which active pauses (kill switches) cover a run, on the run's page."""

from __future__ import annotations

from typing import Any

from django import template

from ledger.models import Run
from ledger.services import pauses

register = template.Library()


@register.inclusion_tag("dashboard/_pause_banner.html")
def pause_banner(run: Run) -> dict[str, Any]:
    """The active pauses that cover ``run`` (its agent, or a tool it has used), each with what it
    refuses. One query when the run's tenant has no active pause."""
    return {
        "run": run,
        "covering": [
            {"pause": p, "what": pauses.describe(p), "by": pauses.created_by_label(p)}
            for p in pauses.pauses_covering_run(run=run)
        ],
    }
