"""Checkpoints: what an agent writes (its state, what is done and pending, how to recover) and
the checkpoint as the API shows it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from ninja import Schema
from pydantic import Field

from infra.pagination import MAX_CURSOR_LENGTH
from saga_admin.api.schemas.common import ActionId, JSONObject, JSONValue, Out, StrictIn

RecoveryMode = Literal["resume_or_compensate", "resume_only", "compensate_only"]


class CheckpointIn(StrictIn):
    name: str = Field(min_length=1, max_length=200)
    state: JSONObject = Field(default_factory=dict)
    completed_action_ids: list[ActionId] = Field(default_factory=list, max_length=1000)
    pending_action_ids: list[ActionId] = Field(default_factory=list, max_length=1000)
    requires_user_approval: bool = False
    recovery_mode: RecoveryMode = "resume_or_compensate"
    recovery_instructions: str = Field("", max_length=20000)
    summary: str = Field("", max_length=20000)
    trace_links: list[JSONValue] = Field(default_factory=list, max_length=100)


class PageQuery(Schema):
    cursor: str | None = Field(None, max_length=MAX_CURSOR_LENGTH)
    limit: int = Field(50, ge=1, le=200)


class CheckpointOut(Out):
    id: str
    run_id: str
    name: str
    state: JSONObject
    completed_action_ids: list[str]
    pending_action_ids: list[str]
    requires_user_approval: bool
    recovery_mode: str
    recovery_instructions: str
    summary: str
    trace_links: list[JSONValue]
    created_at: datetime


class CheckpointPageOut(Out):
    items: list[CheckpointOut]
    next_cursor: str | None = None
