"""Jobs and compensators the benchmark enqueues; they do nothing, so what is measured is the
machinery around them (RQ, the worker class, the unwind engine's bookkeeping)."""

from __future__ import annotations

import time
from typing import Any

from rq import Queue, get_current_job


def noop() -> None:
    """L3's unit of work: nothing at all."""


def chain(remaining: int, queue_name: str, done_key: str) -> None:
    """A no-op that enqueues the next one, like an unwind step enqueueing the next step: the
    per-job cost of strictly sequential work on this worker class. The last one stamps Redis."""
    job = get_current_job()
    assert job is not None
    if remaining > 1:
        Queue(queue_name, connection=job.connection).enqueue(chain, remaining - 1, queue_name, done_key)
    else:
        job.connection.set(done_key, repr(time.time()), ex=3600)


def noop_compensator(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """A Python compensator that succeeds at once (the unwind throughput benchmark's tool)."""
    return {"state": "compensated"}
