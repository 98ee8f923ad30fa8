"""Approvals: the inbox's filters, an approver's decision, the approval and its grants."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Schema
from pydantic import Field

from infra.pagination import MAX_CURSOR_LENGTH
from recovery.models import Approval, ApprovalGrant
from saga_admin.api.schemas.common import Out, ReasonIn


class ApproveIn(ReasonIn):
    args: dict[str, Any] | None = Field(None, description="Edited arguments; both versions are audited.")
    args_hash: str | None = Field(
        None, description="The args_hash you were shown; refused (409) if it changed."
    )


class ApprovalFilters(Schema):
    status: str | None = Field(
        "pending", description="pending (default) | approved | rejected | expired | all"
    )
    kind: str | None = Field(None, description="action | compensation")
    cursor: str | None = Field(
        None, max_length=MAX_CURSOR_LENGTH, description="The next_cursor of the previous page."
    )
    limit: int = Field(50, ge=1, le=200)


class ApprovalGrantOut(Out):
    by: str = Field(
        description="The person: a dashboard user's name, or `<owner> (approver key <name>)` for a "
        "grant through a key they own."
    )
    reason: str
    at: datetime

    @staticmethod
    def resolve_by(grant: ApprovalGrant) -> str:
        return grant.label or grant.approver

    @staticmethod
    def resolve_at(grant: ApprovalGrant) -> datetime:
        return grant.created_at


# The approval deadline's fields, described once for both shapes of an approval.
ON_TIMEOUT_DOC = (
    "What its deadline (expires_at) does when nobody decided by then (its policy's on_timeout): reject "
    '(it becomes expired with reason "timed_out" and the action rejected), or escalate (once, to '
    "escalate_to, with a fresh deadline; the next timeout rejects)."
)
ESCALATE_TO_DOC = (
    "To whom it escalates on timeout: a role (approver, admin) or a username; null: it does not."
)
ESCALATED_AT_DOC = "When it escalated (null: not escalated); since then only escalate_to decides it."


class ApprovalShown(Out):
    """What an approval shows that it does not hold as shown, for both ways it is shown (the
    inbox's ``ApprovalOut``, an action's ``ApprovalSummaryOut``): its grants (read only when it
    needs several people) and whom it escalates to (null: nobody). No fields of its own: each
    schema declares them, in its order."""

    @staticmethod
    def resolve_grants(approval: Approval) -> list[ApprovalGrant]:
        return approval_grants(approval)

    @staticmethod
    def resolve_escalate_to(approval: Approval) -> str | None:
        return approval.escalate_to or None


class ApprovalOut(ApprovalShown):
    id: str
    kind: str
    run_id: str
    action_id: str
    step_id: str | None
    status: str
    risk: str
    tool: str
    args: Any = None
    args_hash: str
    approved_args: Any = None
    reason: str = Field(
        description='The decider\'s reason; "timed_out" for one nobody decided before its deadline.'
    )
    expires_at: datetime = Field(description="Its deadline: decided by then, or it times out (on_timeout).")
    created_at: datetime
    decided_at: datetime | None
    previous_id: str | None = Field(
        None, description="The expired or rejected approval this one asks again (request-again)."
    )
    approvers_required: int = Field(
        1, description="How many distinct people must grant it; the requester never counts."
    )
    grants: list[ApprovalGrantOut] = Field(
        default_factory=list,
        description="The grants so far of an approval that needs several people (it stays pending until the last).",
    )

    on_timeout: Literal["reject", "escalate"] = Field("reject", description=ON_TIMEOUT_DOC)
    escalate_to: str | None = Field(None, description=ESCALATE_TO_DOC)
    escalated_at: datetime | None = Field(None, description=ESCALATED_AT_DOC)


class ApprovalPageOut(Out):
    items: list[ApprovalOut]
    next_cursor: str | None


def approval_grants(approval: Approval) -> list[ApprovalGrant]:
    """The grants of an approval that needs several people (none read for one that needs one)."""
    if approval.approvers_required <= 1:
        return []
    return list(approval.grants.all())
