"""Unwinds (a compensation carried out step by step, newest action first) and their steps."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema

from recovery import selectors
from recovery.models import Unwind, UnwindStep


class StepOut(Schema):
    id: str
    position: int
    action_id: str
    action_tool: str
    tool: str
    args: Any = None
    strategy: str
    requires_approval: bool
    approval_id: str | None
    status: str
    attempts: int
    max_attempts: int
    error: str
    result: Any = None
    started_at: datetime | None
    finished_at: datetime | None


class UnwindOut(Schema):
    id: str
    run_id: str
    item_id: str | None
    status: str
    automatic: bool
    on_failure: str
    reason: str
    created_at: datetime
    finished_at: datetime | None
    steps: list[StepOut]


def step_out(step: UnwindStep) -> dict[str, Any]:
    approval = getattr(step, "approval", None)  # reverse one-to-one: absent → None
    return {
        "id": step.pk,
        "position": step.position,
        "action_id": step.action_id,
        "action_tool": step.action.tool,
        "tool": step.tool,
        "args": step.args,
        "strategy": step.strategy,
        "requires_approval": step.requires_approval,
        "approval_id": getattr(approval, "pk", None),
        "status": step.status,
        "attempts": step.attempts,
        "max_attempts": step.max_attempts,
        "error": step.error,
        "result": step.result,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
    }


def unwind_out(unwind: Unwind) -> dict[str, Any]:
    return {
        "id": unwind.pk,
        "run_id": unwind.run_id,
        "item_id": unwind.item_id,
        "status": unwind.status,
        "automatic": unwind.automatic,
        "on_failure": unwind.on_failure,
        "reason": unwind.reason,
        "created_at": unwind.created_at,
        "finished_at": unwind.finished_at,
        "steps": [step_out(s) for s in selectors.unwind_steps(unwind=unwind)],
    }
