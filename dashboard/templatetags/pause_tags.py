"""The pause banner: which active pauses (kill switches) cover a run, on the run's page."""

from __future__ import annotations

from typing import Any

from django import template

from ledger.models import Run
from ledger.services import pauses

register = template.Library()


@register.inclusion_tag("dashboard/_pause_banner.html")
def pause_banner(run: Run) -> dict[str, Any]:
    """The active pauses that cover ``run`` (one that refused one of its actions, its agent, or a
    tool it has used), each with what it refuses and what of this run it refused. One query when
    the run's tenant has no active pause."""
    return {
        "run": run,
        "covering": [
            {
                "pause": c.pause,
                "what": pauses.describe(c.pause),
                "by": pauses.created_by_label(c.pause),
                "refused_tools": c.refused_tools,
            }
            for c in pauses.pauses_on_run(run=run)
        ],
    }
