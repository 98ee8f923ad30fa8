"""The demo world's Python compensators, registered by dotted path in ``demo/policies/*.json``
(``{"python": "demo.compensators.cancel_license"}``), next to the webhook ones the same world
serves over HTTP. Both kinds call the same ``demo.services`` functions through the same
idempotency store, so they behave alike; only the transport differs.

Each receives the webhook body's fields as keyword arguments plus ``idempotency_key``, and
answers as ``recovery.compensators`` expects: a dict with ``"state"`` when done (an "already
compensated" answer is done too), ``CompensationDrifted`` when a person changed the record since
the action, ``CompensationFailed`` for a permanent refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from demo import services
from demo.services import WorldResult
from recovery.compensators import CompensationDrifted, CompensationFailed


def _answer(result: WorldResult) -> dict[str, Any]:
    if result.ok:
        return {"state": result.body.get("state")}
    error = result.body.get("error", {})
    message = f"{error.get('code', 'refused')}: {error.get('message', '')}".strip()
    if result.status == 409:
        # Already compensated (an earlier attempt, or a person, did it): the goal is reached.
        return {"state": error.get("details", {}).get("state")}
    if result.status == 412:
        raise CompensationDrifted(message)
    raise CompensationFailed(message)


def _once(
    operation: str, idempotency_key: str, payload: dict[str, Any], perform: Callable[[], WorldResult]
) -> Any:
    return _answer(
        services.world_call(operation=operation, key=idempotency_key, payload=payload, perform=perform)
    )


def _arg(args: Any, name: str, fallback: Any = None) -> Any:
    return args.get(name, fallback) if isinstance(args, dict) else fallback


def cancel_license(*, args: Any, target_id: str, after_snapshot: Any, idempotency_key: str, **_: Any) -> Any:
    """workspace.cancel_license: stop paying for the seat the agent provisioned."""
    email = _arg(args, "email", target_id)
    return _once(
        "workspace.cancel_license",
        idempotency_key,
        {"email": email},
        lambda: services.license_cancel(email=email, after_snapshot=after_snapshot),
    )


def discard_draft(*, args: Any, after_snapshot: Any, idempotency_key: str, **_: Any) -> Any:
    """email.discard_draft: a draft nobody sent is simply thrown away."""
    message_id = _arg(args, "message_id") or _arg(after_snapshot, "message_id")
    if message_id is None:
        raise CompensationFailed("No message_id in the args or the after snapshot: cannot tell which draft.")
    return _once(
        "email.discard_draft",
        idempotency_key,
        {"message_id": message_id},
        lambda: services.email_draft_discard(message_id=int(message_id)),
    )


def restore_contact(
    *, target_id: str, before_snapshot: Any, after_snapshot: Any, idempotency_key: str, **_: Any
) -> Any:
    """crm.restore_contact: put a contact's tier/owner/email back from the before snapshot."""
    return _once(
        "crm.restore_contact",
        idempotency_key,
        {"contact_id": target_id, "before": before_snapshot},
        lambda: services.contact_restore(
            contact_id=target_id, before_snapshot=before_snapshot, after_snapshot=after_snapshot
        ),
    )


def read_contact(*, target_id: str, **_: Any) -> Any:
    """The state reader for crm.restore_contact: Saga Admin compares it with the after snapshot
    before it asks for a restore (drift check ahead of the call, not only inside it)."""
    result = services.contact_read(contact_id=target_id)
    if not result.ok:
        raise CompensationFailed(result.body["error"]["message"])
    return result.body["state"]


def restore_title(*, args: Any, target_id: str, after_snapshot: Any, idempotency_key: str, **_: Any) -> Any:
    """hr.update_title as its own undo: the policy's compensation args carry the title the call
    replaced (``$before.title``, the before-image Saga Admin recorded). A record someone changed
    since the agent is refused as drifted, never overwritten."""
    email = _arg(args, "email", target_id)
    title = _arg(args, "title")
    if not isinstance(email, str) or not email:
        raise CompensationFailed("No email in the args or the target: cannot tell whose title to restore.")
    return _once(
        "hr.restore_title",
        idempotency_key,
        {"email": email, "title": title},
        lambda: services.hr_title_restore(email=email, title=title, after_snapshot=after_snapshot),
    )
