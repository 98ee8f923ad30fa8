"""A Python compensator for scenario 2: it performs its side effect, then kills its own process
before the engine can commit the outcome (a crash between the external call and the commit).

Its "external system" is a directory (``SAGA_RELIABILITY_EFFECTS_DIR``): like any well-behaved
tool it applies an effect once per idempotency key (an O_EXCL marker file) and appends one line
per applied effect to ``effects.log``, which the test counts.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any


def crash_after_effect(*, idempotency_key: str, action_id: str, **_fields: Any) -> dict[str, Any]:
    root = Path(os.environ["SAGA_RELIABILITY_EFFECTS_DIR"])
    try:
        fd = os.open(root / f"{idempotency_key}.effect", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return {"state": {"replayed": idempotency_key}}
    os.close(fd)
    with (root / "effects.log").open("a") as log:
        log.write(f"{action_id} {idempotency_key}\n")
        log.flush()
        os.fsync(log.fileno())
    # The effect is in the world; die before the engine records it.
    os.kill(os.getpid(), signal.SIGKILL)
    return {"state": {"unreachable": True}}
