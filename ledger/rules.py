"""Domain rules that more than one place applies, each written once. (A tool policy's rules on a
call's args are another thing: ``ledger.policies.rules``.)

- A reason: every decision a person or automation takes (close, resume, compensate, reconcile,
  approve, reject, retry, skip) carries one, kept in the audit log. One message, one maximum
  length, for the dashboard's forms, the API's schemas and the services alike.
- The pivot: the saga's irreversible commit. Compensatable steps come first, the pivot last, only
  retriable steps after it; a compensatable step after the pivot is warned about, when it is
  recorded and whenever the run is shown.
"""

from __future__ import annotations

from typing import Any

from infra import errors
from ledger.models import Action, ActionClass

REASON_MAX_LENGTH = 2000
REASON_REQUIRED = "A reason is required."


def reason_required(reason: str) -> str:
    """The reason, stripped; ``ValidationFailed`` when it is empty or too long."""
    cleaned = reason.strip()
    if not cleaned:
        raise errors.ValidationFailed(REASON_REQUIRED, details={"reason": "required"})
    if len(cleaned) > REASON_MAX_LENGTH:
        raise errors.ValidationFailed(
            f"A reason is at most {REASON_MAX_LENGTH} characters; this one has {len(cleaned)}.",
            details={"reason": "too_long", "max_length": REASON_MAX_LENGTH},
        )
    return cleaned


# --- The pivot --------------------------------------------------------------------------------

COMPENSATABLE_CLASSES = frozenset(
    {ActionClass.DRAFT_ONLY, ActionClass.INTERNAL_UPDATE, ActionClass.EXTERNAL_REVERSIBLE}
)
# An irreversible action that was refused or failed never committed anything: it is no pivot.
NOT_A_PIVOT = (Action.Status.REJECTED, Action.Status.FAILED)


def is_pivot(action_class: str, status: str) -> bool:
    return action_class == ActionClass.EXTERNAL_IRREVERSIBLE and status not in NOT_A_PIVOT


def pivot_order_warning(
    *, action_id: str, tool: str, seq: int, pivot_id: str, pivot_tool: str, pivot_seq: int
) -> dict[str, Any]:
    """The warning for a compensatable action (``action_id``) that came after the pivot."""
    return {
        "code": "pivot_order",
        "action_id": action_id,
        "pivot_action_id": pivot_id,
        "message": (
            f"{tool} (#{seq}) can be undone but came after the irreversible {pivot_tool} (#{pivot_seq}); "
            "compensatable steps should come before the pivot."
        ),
    }
