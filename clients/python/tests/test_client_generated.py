"""The blocking client is generated from the asyncio one (unasync, as httpcore does): the twins
cannot drift, because the committed ``saga_client/client.py`` must be exactly what
``scripts/generate_sync_client.py`` makes of ``saga_client/aio.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import saga_client
from saga_client import AsyncRun, AsyncSaga, Run, Saga

DISTRIBUTION = Path(saga_client.__file__).resolve().parents[1]
GENERATOR = DISTRIBUTION / "scripts" / "generate_sync_client.py"


def test_the_committed_blocking_client_is_what_the_generator_makes_of_the_async_one():
    checked = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_twins_offer_the_same_methods():
    def public(cls: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("_")}

    assert public(Saga) - {"close"} == public(AsyncSaga) - {"aclose"}
    assert public(Run) == public(AsyncRun)


def test_only_the_async_run_is_awaitable():
    assert hasattr(AsyncRun, "__await__") and not hasattr(Run, "__await__")
