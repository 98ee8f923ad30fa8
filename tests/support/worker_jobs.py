"""Jobs a test enqueues on a real ``saga_worker`` to see how it runs them (never the product's)."""

from __future__ import annotations

import os
import time

import structlog


def hang(seconds: float) -> None:
    """A call that does not return in time (a stuck peer)."""
    time.sleep(seconds)


def bind_and_leave(**values: str) -> int:
    """Binds log context and leaves it bound, as a careless job would; returns its process id."""
    structlog.contextvars.bind_contextvars(**values)
    return os.getpid()


def context_seen() -> dict[str, object]:
    """What the next job finds: the log context, and the process it ran in."""
    return {"context": dict(structlog.contextvars.get_contextvars()), "pid": os.getpid()}
