"""What an undo step's reads found different (``UnwindStep.read_checks["differences"]``): the
unwind's step list shows it next to the sentence the worker wrote into the step's error, for a
drift (the value now, against the after-image) or an undo not restored (the value read back,
against the before-image)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django import template

from recovery.models import UnwindStep

register = template.Library()


@dataclass(frozen=True)
class StepDifference:
    path: str
    expected: str  # JSON text; "" when absent
    actual: str
    absent: str  # "actual" (gone), "expected" (appeared) or ""


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def step_differences(step: UnwindStep) -> tuple[str, list[StepDifference]]:
    """(what was compared, the differences) of a step's reads; ("", []) when it found none."""
    checks = step.read_checks if isinstance(step.read_checks, dict) else {}
    raw = [d for d in checks.get("differences") or [] if isinstance(d, dict)]
    if not raw:
        return "", []
    compared = (
        "Now, against the after-image"
        if step.status == UnwindStep.Status.DRIFTED
        else "Read back, against the before-image"
    )
    return compared, [
        StepDifference(
            path=str(d.get("path", "")),
            expected="" if d.get("absent") == "expected" else _show(d.get("expected")),
            actual="" if d.get("absent") == "actual" else _show(d.get("actual")),
            absent=str(d.get("absent") or ""),
        )
        for d in raw
    ]


@register.simple_tag
def step_read_differences(step: UnwindStep) -> dict[str, Any]:
    """``{% step_read_differences step as rd %}``: ``rd.compared``, ``rd.differences``."""
    compared, differences = step_differences(step)
    return {"compared": compared, "differences": differences}
