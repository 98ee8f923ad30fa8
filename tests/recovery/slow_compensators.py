"""A Python compensator slower than a step's lease, for the lease-renewal tests: it runs in a real
worker process, so it reports through files (``SAGA_TEST_CALLS_DIR``): one line per call in
``calls.log`` (attempt, idempotency key, start time) and ``running`` while a call is in flight.
The first attempt takes ``SAGA_TEST_SLOW_S`` seconds; later ones (a takeover) return at once."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def slow_undo(*, attempt: int, idempotency_key: str, **_fields: Any) -> dict[str, Any]:
    root = Path(os.environ["SAGA_TEST_CALLS_DIR"])
    with (root / "calls.log").open("a") as log:
        log.write(f"{attempt} {idempotency_key} {time.time():.3f}\n")
    marker = root / "running"
    marker.write_text(idempotency_key)
    try:
        if attempt == 1:
            time.sleep(float(os.environ.get("SAGA_TEST_SLOW_S", "7")))
    finally:
        marker.unlink(missing_ok=True)
    return {"state": {"undone_by": idempotency_key}}
