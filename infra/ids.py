"""Opaque, prefixed, time-ordered identifiers (``run_01JD…``).

A ULID body (48-bit millisecond time + 80 random bits, Crockford base32) keeps ids sortable by
creation time, which keyset pagination relies on, and unguessable, which tenant isolation
appreciates.
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import datetime

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
# What any of our ids can look like ("<prefix>_<ulid>"). A client's id that does not match cannot
# exist, and is answered without a query (a NUL byte would otherwise reach PostgreSQL as an error).
_ID_RE = re.compile(r"^[a-z]{3}_[0-9a-z]{1,36}$")


def looks_like_id(value: object) -> bool:
    return isinstance(value, str) and _ID_RE.match(value) is not None


def _ulid(at: datetime | None = None) -> str:
    millis = int((at.timestamp() if at is not None else time.time()) * 1000)
    value = (millis << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_id(prefix: str, *, at: datetime | None = None) -> str:
    """A new id; ``at``: the time its ordering part stands for (seeded history), default now."""
    return f"{prefix}_{_ulid(at)}"


# Module-level functions so migrations can reference them by import path.
def new_run_id() -> str:
    return new_id("run")


def new_action_id() -> str:
    return new_id("act")


def new_checkpoint_id() -> str:
    return new_id("chk")


def new_key_id() -> str:
    return new_id("key")


def new_recovery_id() -> str:
    return new_id("rec")


def new_approval_id() -> str:
    return new_id("apr")


def new_command_id() -> str:
    return new_id("cmd")


def new_unwind_id() -> str:
    return new_id("unw")


def new_step_id() -> str:
    return new_id("stp")


def new_pause_id() -> str:
    return new_id("pau")


def new_notification_id() -> str:
    return new_id("ntf")


def new_channel_id() -> str:
    return new_id("nch")


def new_bulk_id() -> str:
    return new_id("blk")
