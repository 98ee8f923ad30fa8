"""Pauses (kill switches): what an operator sends to pause an agent or a tool, and the pause."""

from __future__ import annotations

from datetime import datetime

from ninja import Schema
from pydantic import Field

from infra.pagination import MAX_CURSOR_LENGTH
from ledger.models import Pause
from ledger.rules import REASON_MAX_LENGTH
from ledger.services import pauses as ledger_pauses
from saga_admin.api.schemas.common import Out, StrictIn


class PauseIn(StrictIn):
    agent: str = Field(
        "",
        max_length=ledger_pauses.NAME_MAX_LENGTH,
        description="Agent name or glob: matches the agent that owns a run (its key's name) or the "
        "agent the run declares. New runs of it, and new actions in its runs, are refused.",
    )
    tool: str = Field(
        "",
        max_length=ledger_pauses.NAME_MAX_LENGTH,
        description="Tool name or glob (payments.*): new actions of it are refused (with agent: only "
        "in that agent's runs). At least one of agent and tool.",
    )
    reason: str = Field(
        ..., min_length=1, max_length=REASON_MAX_LENGTH, description="Why; kept in the audit log."
    )


class PauseFilters(Schema):
    status: str | None = Field("active", description="active (default) | lifted | all")
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(50, ge=1, le=200)


class PauseOut(Out):
    id: str
    agent: str
    tool: str
    status: str = Field(description="active | lifted")
    reason: str
    created_by: str
    created_at: datetime
    lifted_by: str | None
    lifted_at: datetime | None
    lift_reason: str

    @staticmethod
    def resolve_status(pause: Pause) -> str:
        return "active" if pause.is_active else "lifted"

    @staticmethod
    def resolve_created_by(pause: Pause) -> str:
        return ledger_pauses.created_by_label(pause)

    @staticmethod
    def resolve_lifted_by(pause: Pause) -> str | None:
        return None if pause.is_active else ledger_pauses.lifted_by_label(pause)


class PausePageOut(Out):
    items: list[PauseOut]
    next_cursor: str | None
