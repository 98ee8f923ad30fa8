"""A lock wait cut short by ``lock_timeout`` told apart from every other database error.

A writer that waits for another writer of the same idempotency key (the API's key record, an
action's or a plan's key locks) sets ``lock_timeout`` rather than queueing behind it: when the wait
times out (SQLSTATE 55P03, ``lock_not_available``), the other writer is still at work, and the
caller hears ``IdempotencyKeyInFlight`` (retry shortly) instead of a database error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import OperationalError

from infra import errors

LOCK_NOT_AVAILABLE = "55P03"


def sqlstate(exc: OperationalError) -> str | None:
    """The SQLSTATE psycopg read from the server, where there is one."""
    return getattr(exc.__cause__, "sqlstate", None)


@contextmanager
def in_flight_on_lock_timeout(message: str, *, details: dict[str, Any]) -> Iterator[None]:
    """A lock wait in the block that timed out becomes ``IdempotencyKeyInFlight(message)``; any
    other error goes up as it is."""
    try:
        yield
    except OperationalError as exc:
        if sqlstate(exc) == LOCK_NOT_AVAILABLE:
            raise errors.IdempotencyKeyInFlight(message, details=details) from exc
        raise
