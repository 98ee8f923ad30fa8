"""docs/COMPENSATORS.md's example compensators (Flask, FastAPI, Express) run as their own
processes, and ``saga-compensator-check`` passes every required case against each, drift
detection included. The doc shows each file whole: a test holds the doc and the files equal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ROOT, free_port, wait_for

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "docs" / "examples" / "compensators"
DOC = ROOT / "docs" / "COMPENSATORS.md"
KIT = shutil.which("saga-compensator-check") or str(ROOT / ".venv" / "bin" / "saga-compensator-check")
SECRET = "example-compensator-secret"


def _express_installed() -> Path:
    folder = EXAMPLES / "express"
    if not (folder / "node_modules" / "express").exists():
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=folder, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return folder


def _command(example: str) -> list[str]:
    if example == "express":
        return ["node", str(_express_installed() / "compensator.mjs")]
    return [sys.executable, str(EXAMPLES / f"{example}_compensator.py")]


@contextmanager
def _serving(example: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "COMPENSATOR_SECRET": SECRET, "PORT": str(port)}
    log = (tmp_path / f"{example}.log").open("wb")
    process = subprocess.Popen(
        _command(example), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}/saga"

    def answers() -> bool:
        try:
            httpx.get(f"{base}/licences/x", timeout=1)
        except httpx.TransportError:
            return process.poll() is not None
        return True

    try:
        wait_for(answers, timeout=60, what=f"the {example} example")
        assert process.poll() is None, (tmp_path / f"{example}.log").read_text()
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


@pytest.mark.parametrize("example", ["flask", "fastapi", "express"])
def test_each_example_compensator_passes_the_kit(example: str, tmp_path: Path) -> None:
    with _serving(example, tmp_path) as base:
        done = subprocess.run(
            [
                KIT,
                f"{base}/cancel_license",
                "--secret-env",
                "COMPENSATOR_SECRET",
                "--request",
                str(EXAMPLES / "step.json"),
                "--state-url",
                f"{base}/licences/ada@example.com",
                "--calls",
                "5",
                "--json",
            ],
            env={**os.environ, "COMPENSATOR_SECRET": SECRET},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stdout + done.stderr + (tmp_path / f"{example}.log").read_text()
    verdicts = {case["id"]: case["verdict"] for case in json.loads(done.stdout)["cases"]}
    assert {case for case, verdict in verdicts.items() if verdict != "pass"} == {"tls"}  # plain HTTP here


def test_the_doc_shows_each_example_whole() -> None:
    doc = DOC.read_text()
    for path in ("flask_compensator.py", "fastapi_compensator.py", "express/compensator.mjs", "step.json"):
        text = (EXAMPLES / path).read_text()
        assert text.strip() in doc, f"docs/COMPENSATORS.md does not show {path} as it is"
