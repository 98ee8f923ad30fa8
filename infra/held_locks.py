"""A lock held across many transactions that still holds behind PgBouncer's transaction pooling.

A session advisory lock (``pg_try_advisory_lock``) belongs to the server connection, and
transaction pooling hands that connection to whichever client runs the next transaction: the lock
stays on a pooled backend after its holder is done (the next one finds the work "busy" with
nobody at it) and the unlock may run on another backend, releasing nothing. Here the lock is
transaction-scoped (``pg_try_advisory_xact_lock``) in a transaction of its own, on a connection of
its own, kept open for as long as the lock is held. PostgreSQL releases it when that transaction
ends: at the end of the ``with``, or when the holder dies and its connection goes (PgBouncer
closes a server connection whose client left in the middle of a transaction). The work under the
lock runs on the thread's usual connection, in as many short transactions as it needs.

The cost is a second connection (behind a pooler, a server connection pinned) while the lock is
held. Its transaction takes no snapshot and no transaction id, so it holds back no vacuum.
``idle_in_transaction_session_timeout`` is turned off for it alone. A pooler's own idle
transaction timeout could still end it, so ``check()`` asks before each step that must not run
unlocked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections


class LockLost(Exception):
    """The lock's connection went away while the work under it was still going on."""


class HeldLock:
    def __init__(self, name: str, raw: Any) -> None:
        self.name = name
        self._raw = raw

    def check(self) -> None:
        """Raise ``LockLost`` unless the lock's transaction is still open (one round trip)."""
        try:
            with self._raw.cursor() as cursor:
                cursor.execute("SELECT 1")
        except Exception as exc:
            raise LockLost(f"the lock {self.name!r} was lost: its connection went away ({exc})") from exc


@contextlib.contextmanager
def held_lock(name: str, *, using: str = DEFAULT_DB_ALIAS) -> Iterator[HeldLock | None]:
    """Try to take the lock named ``name`` (no wait): the held lock, or None when another holds it."""
    wrapper = connections[using]
    # The same parameters as the thread's connection (DATABASE_URL, the pooler's settings), not
    # Django's connection object: this one stays in its transaction while that one commits.
    raw = psycopg.connect(**wrapper.get_connection_params())
    try:
        with raw.cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
            cursor.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))", [name])
            row = cursor.fetchone()
        held = bool(row and row[0])
        yield HeldLock(name, raw) if held else None
    finally:
        with contextlib.suppress(Exception):
            raw.rollback()
        raw.close()
