"""Running the TypeScript client's tooling (npm, tsc, vitest) from the Python suite."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
# Written after a successful `npm ci`: the hash of the lockfile it installed.
STAMP = PACKAGE / "node_modules" / ".saga-lock-sha256"


class Npm:
    """npm and npx in ``clients/typescript`` (or another directory), with their output kept."""

    def __init__(self) -> None:
        npm = shutil.which("npm")
        assert npm, "the TypeScript client's tests need Node.js >= 20 and npm on PATH"
        self.npm = npm
        self.npx_bin = shutil.which("npx") or "npx"

    def lock_hash(self) -> str:
        return hashlib.sha256((PACKAGE / "package-lock.json").read_bytes()).hexdigest()

    def install(self) -> None:
        """``npm ci`` from the committed lockfile, skipped while node_modules holds that lock."""
        if STAMP.exists() and STAMP.read_text().strip() == self.lock_hash():
            return
        done = self.run(self.npm, "ci", "--no-audit", "--no-fund", timeout=900)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
        STAMP.write_text(self.lock_hash())

    def run(
        self, *args: str, cwd: Path = PACKAGE, env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - the suite's own commands
            list(args),
            cwd=cwd,
            env={**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0", **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def npx(
        self, *args: str, cwd: Path = PACKAGE, env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return self.run(self.npx_bin, *args, cwd=cwd, env=env, timeout=timeout)


def report(done: subprocess.CompletedProcess[str], limit: int = 20000) -> str:
    """A command's output for an assertion message (the end, where failures are summed up)."""
    text = f"exit {done.returncode}\n--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    return text[-limit:]
