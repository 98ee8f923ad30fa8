"""The approval inbox's reads: pending approvals one keyset page at a time (with what their cards
read, in the same query) and the nav badge's capped count. Scoped to the user's tenants."""

from __future__ import annotations

from dataclasses import dataclass

from dashboard import permissions
from dashboard.permissions import Someone
from infra.pagination import OLDEST_FIRST, keyset_page
from recovery import selectors as recovery_selectors
from recovery.models import Approval

APPROVAL_BADGE_CAP = 99
APPROVALS_PAGE = 50
# What a card reads (``dashboard.presenters.approval_cards.approval_card_content``), fetched with the approval in one query.
APPROVAL_CARD_RELATED = (
    "action",
    "run",
    "tenant",
    "step__unwind__requested_by",
    "step__unwind__requested_by_key",
    "requested_by",
    "requested_by_key",
    "decided_by",
)


@dataclass
class ApprovalPage:
    approvals: list[Approval]
    next_cursor: str = ""


def approvals_pending(*, user: Someone, cursor: str = "", page_size: int | None = None) -> ApprovalPage:
    """Pending approvals, oldest (closest to expiring) first, one keyset page at a time: each card
    carries two forms and pretty-printed JSON, so a page of hundreds took longer to render than
    an approver reads."""
    qs = (
        recovery_selectors.approvals_pending(tenants=permissions.tenant_ids_for(user))
        .select_related(*APPROVAL_CARD_RELATED)
        .prefetch_related("grants")
    )
    page = keyset_page(qs, keys=OLDEST_FIRST, cursor=cursor, limit=page_size or APPROVALS_PAGE, strict=False)
    return ApprovalPage(approvals=page.items, next_cursor=page.next_cursor or "")


def approvals_pending_count(*, user: Someone) -> int:
    qs = recovery_selectors.approvals_pending(tenants=permissions.tenant_ids_for(user))
    return len(qs.order_by().values_list("pk", flat=True)[: APPROVAL_BADGE_CAP + 1])
