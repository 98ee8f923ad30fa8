"""Commands: the resume and cancel an agent is given (polled, or pushed to its resume_url)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema

from recovery.models import AgentCommand
from saga_admin.api.schemas.checkpoints import CheckpointOut, checkpoint_out
from saga_admin.api.schemas.common import Out, fields_of


class AgentCommandOut(Schema):
    id: str
    run_id: str
    kind: Literal["resume", "cancel"]
    status: Literal["pending", "acked", "cancelled"]
    reason: str
    checkpoint: CheckpointOut | None = None
    created_at: datetime
    acked_at: datetime | None = None
    # Withdrawn before the agent acknowledged it (the run ended, was cancelled or failed again).
    cancelled_at: datetime | None = None
    # Pushes to the run's resume_url: when one got through, how many were tried, and why the last
    # one failed ("Refused: …" when the URL may not be reached; then it is not tried again).
    delivered_at: datetime | None = None
    delivery_attempts: int = 0
    delivery_error: str = ""


class AgentCommandsOut(Schema):
    commands: list[AgentCommandOut]


class CommandOut(Out):
    id: str
    kind: str
    run_id: str
    checkpoint_id: str | None
    status: str
    reason: str
    created_at: datetime


def command_out(command: AgentCommand) -> dict[str, Any]:
    return AgentCommandOut.model_validate(
        {
            **fields_of(command, AgentCommandOut),
            "run_id": command.run_id,
            "checkpoint": checkpoint_out(command.checkpoint) if command.checkpoint is not None else None,
        }
    ).model_dump(mode="json")
