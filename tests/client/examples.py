"""Running the client's examples (clients/python/examples) as their readers would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

EXAMPLES = Path(__file__).resolve().parents[2] / "clients" / "python" / "examples"


def run_example(name: str, *, url: str, key: str, approvals_api: httpx.Client) -> str:
    """Run an example as its reader would (its own process, against the live server) while Bob's
    bot approves what it asks for; its output."""
    env = {**os.environ, "SAGA_URL": url, "SAGA_API_KEY": key}
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        for approval in approvals_api.get("/approvals").json()["items"]:
            approvals_api.post(
                f"/approvals/{approval['id']}/approve", json={"reason": "ok"}
            ).raise_for_status()
        time.sleep(0.1)
    out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    return out
