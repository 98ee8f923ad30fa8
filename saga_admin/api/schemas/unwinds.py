"""Unwinds (a compensation carried out step by step, newest action first) and their steps."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from recovery import selectors
from recovery.models import Unwind, UnwindStep
from saga_admin.api.schemas.common import Out


class StepOut(Out):
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
    # The reader's checks (policy ``before``, API.md "Before-images and verified undo"): whether the
    # value read back after the undo is the before-image (null: no reader, or not done), and
    # {"now", "read_back", "differences", "reads": [{"phase", "tool", "kind", "ok", "error", "at", "ms"}]}.
    verified: bool | None = None
    read_checks: Any = None
    started_at: datetime | None
    finished_at: datetime | None

    @staticmethod
    def resolve_action_tool(step: UnwindStep) -> str:
        return step.action.tool

    @staticmethod
    def resolve_approval_id(step: UnwindStep) -> str | None:
        approval = getattr(step, "approval", None)  # reverse one-to-one: absent → None
        return getattr(approval, "pk", None)


class UnwindOut(Out):
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

    @staticmethod
    def resolve_steps(unwind: Unwind) -> list[UnwindStep]:
        return selectors.unwind_steps(unwind=unwind)
