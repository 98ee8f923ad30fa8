"""Bulk decisions on low-risk recovery items (close, compensate): each item in its own
transaction, an outcome per item.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from infra import errors
from infra.conf import saga
from ledger.audit import Actor
from ledger.models import Risk
from ledger.rules import reason_required
from recovery import decisions
from recovery.actions.compensations import unwind_start
from recovery.actions.resolutions import item_close
from recovery.models import RecoveryItem, Unwind


@dataclass(frozen=True)
class BulkOutcome:
    item_id: str
    ok: bool
    code: str = ""
    message: str = ""
    unwind_id: str | None = None
    sentence: str = ""  # the refusal as a person reads it (recovery.decisions); not in as_dict

    def as_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "ok": self.ok,
            "code": self.code,
            "message": self.message,
            "unwind_id": self.unwind_id,
        }


def ticked_bulk_takes(item: RecoveryItem) -> bool:
    """Whether the ticked bulk may take ``item``: low risk (anything riskier deserves a look of its
    own) and not resolved. The queue offers a checkbox exactly where this holds."""
    return _low_enough(item) and item.status != RecoveryItem.Status.RESOLVED


def _low_enough(item: RecoveryItem) -> bool:
    return item.risk == Risk.LOW


def _bulk(
    chosen_items: Iterable[RecoveryItem],
    *,
    reason: str,
    what: str,
    apply: Callable[[RecoveryItem, str], object],
) -> list[BulkOutcome]:
    """One decision per item (``apply(item, reason)``), each in its own transaction: one refusal
    does not undo the others. Only low-risk items qualify: anything riskier deserves a look of its
    own."""
    reason = reason_required(reason)
    chosen = list(chosen_items)
    cap = saga().bulk_max_items
    if len(chosen) > cap:
        raise errors.ValidationFailed(
            f"At most {cap} items can be handled at once; {len(chosen)} were selected.",
            details={"max_items": cap, "selected": len(chosen)},
        )
    outcomes: list[BulkOutcome] = []
    for item in chosen:
        if not _low_enough(item):  # a resolved one is refused by the decision itself, below
            outcomes.append(
                BulkOutcome(
                    item.pk,
                    False,
                    "risk_too_high",
                    f"Bulk {what} is for low-risk items only; {item.pk} is {item.risk} risk.",
                )
            )
            continue
        try:
            with transaction.atomic():
                result = apply(item, reason)
        except errors.SagaError as exc:
            outcomes.append(
                BulkOutcome(item.pk, False, exc.code, exc.message, sentence=decisions.refusal_sentence(exc))
            )
            continue
        outcomes.append(
            BulkOutcome(item.pk, True, unwind_id=result.pk if isinstance(result, Unwind) else None)
        )
    return outcomes


def items_bulk_close(*, items: Iterable[RecoveryItem], actor: Actor, reason: str) -> list[BulkOutcome]:
    return _bulk(
        items,
        reason=reason,
        what="close",
        apply=lambda item, reason: item_close(item=item, actor=actor, reason=reason),
    )


def items_bulk_compensate(*, items: Iterable[RecoveryItem], actor: Actor, reason: str) -> list[BulkOutcome]:
    return _bulk(
        items,
        reason=reason,
        what="compensate",
        apply=lambda item, reason: unwind_start(item=item, actor=actor, reason=reason),
    )
