"""Bulk decisions by filter: the body (the queue's filter, the action, the reason, preview or the
count confirmed), the preview, and the operation with its progress."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from ledger.rules import REASON_MAX_LENGTH
from recovery.actions.bulk_filter import MAX_ITEMS, PREVIEW_ACTIONS, PREVIEW_RUNS, SAMPLE_SIZE
from recovery.bulk.models import ERRORS_KEPT
from recovery.selectors import FILTER_TEXT_MAX_LENGTH, QueueFilter
from saga_admin.api.schemas.common import Out, StrictIn
from saga_admin.api.schemas.queue import (
    AGENT_DOC,
    OLDER_THAN_DOC,
    OLDER_THAN_MAX_MINUTES,
    Q_DOC,
    STATUS_DOC,
    TOOL_DOC,
    ItemOut,
    queue_filter_of,
)


class BulkFilterIn(StrictIn):
    """The fields of ``GET /api/v1/recovery``'s query; at least one must narrow the queue."""

    status: str | None = Field(None, max_length=40, description=STATUS_DOC)
    reason: str | None = Field(None, max_length=40)
    risk: str | None = Field(None, max_length=40)
    older_than: int | None = Field(None, ge=0, le=OLDER_THAN_MAX_MINUTES, description=OLDER_THAN_DOC)
    agent: str | None = Field(None, max_length=FILTER_TEXT_MAX_LENGTH["agent"], description=AGENT_DOC)
    tool: str | None = Field(None, max_length=FILTER_TEXT_MAX_LENGTH["tool"], description=TOOL_DOC)
    q: str | None = Field(None, max_length=FILTER_TEXT_MAX_LENGTH["search"], description=Q_DOC)

    def queue_filter(self) -> QueueFilter:
        return queue_filter_of(self)


class BulkIn(StrictIn):
    filter: BulkFilterIn = Field(description="Which items: a filter with nothing set is 422 filter_required.")
    action: Literal["compensate", "close", "resume", "cancel"] = Field(
        description="The decision for each item (cancel: cancel the item's run)."
    )
    reason: str = Field(
        ..., min_length=1, max_length=REASON_MAX_LENGTH, description="Why; kept in the audit log."
    )
    preview: bool = Field(False, description="true: only count what the filter matches; nothing changes.")
    expected_count: int | None = Field(
        None,
        ge=0,
        le=MAX_ITEMS,
        description="The count the preview showed (required unless preview): a different count now is "
        "409 count_changed and nothing starts.",
    )


class BulkPreviewOut(Out):
    count: int
    by_risk: dict[str, int]
    by_reason: dict[str, int]
    sample: list[ItemOut] = Field(description=f"At most {SAMPLE_SIZE} of the items, newest first.")
    needs_approval: int = Field(
        description="How many of the runs' compensations have a step an approver must grant (compensate only)."
    )
    needs_approval_capped: bool = Field(
        description="needs_approval was counted over only part of the runs (the newest items' first "
        f"{PREVIEW_RUNS} runs, at most {PREVIEW_ACTIONS} of their actions): a lower bound."
    )


class BulkStartOut(Out):
    id: str
    status: str
    total: int


class BulkErrorOut(Out):
    item_id: str
    run_id: str
    code: str
    message: str


class BulkOut(Out):
    id: str
    status: str = Field(description="running | finished | aborted")
    action: str
    reason: str
    filter: dict[str, Any]
    requested_by: str
    total: int
    done: int = Field(description="Items decided.")
    failed: int = Field(description="Items whose decision was refused (see errors).")
    skipped: int = Field(description="Items that changed since the bulk started: not decided.")
    errors: list[BulkErrorOut] = Field(description=f"The first {ERRORS_KEPT} refusals.")
    abort_reason: str
    abort_code: str = Field(
        description="Why the system stopped it: authority_lost (its starter may no longer decide in "
        "the tenant: abort_reason says how); empty when an operator aborted it or it did not stop."
    )
    started_at: datetime
    finished_at: datetime | None

    @staticmethod
    def resolve_requested_by(bulk: Any) -> str:
        return str(bulk.requested_by_label)
