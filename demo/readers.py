"""The demo world's state readers, registered by dotted path in the policy file's ``readers``
(``{"hr.get_user": {"python": "demo.readers.get_user"}}``): how Saga Admin's worker reads the world
now, to check an undo step for drift before it and to verify it after (API.md, "Before-images and
verified undo").

A reader answers what the read tool answers: ``hr.get_user``'s result is ``{"user": <the HR
record>}``, and the policy's ``before.path`` (``"user"``) picks the record out of it as the image.
"""

from __future__ import annotations

from typing import Any

from demo import services


def _email(args: Any, email: Any, target_id: Any) -> str:
    for candidate in (args.get("email") if isinstance(args, dict) else None, email, target_id):
        if isinstance(candidate, str) and candidate:
            return candidate
    raise ValueError("hr.get_user needs an email (args.email): whose record to read.")


def get_user(*, args: Any = None, email: Any = None, target_id: Any = None, **_: Any) -> dict[str, Any]:
    """hr.get_user: one person's HR record, as ``{"user": {...}}``. A person with no record is an
    error (``LookupError``), not an empty image."""
    address = _email(args, email, target_id)
    result = services.hr_user_read(email=address)
    if not result.ok:
        raise LookupError(result.body["error"]["message"])
    return {"user": result.body["state"]}
