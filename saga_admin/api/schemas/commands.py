"""Commands: the resume and cancel an agent is given (polled, or pushed to its resume_url)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Schema
from pydantic import Field

from saga_admin.api.schemas.checkpoints import CheckpointOut
from saga_admin.api.schemas.common import Out


# A resume or cancel command: as the agent polls and acknowledges it, and as an operator's resume
# or cancel answers it.
class CommandOut(Out):
    id: str
    run_id: str
    kind: Literal["resume", "cancel"]
    status: Literal["pending", "acked", "cancelled"]
    reason: str
    checkpoint_id: str | None = Field(None, description="The checkpoint to resume from (a resume's).")
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
    commands: list[CommandOut]
