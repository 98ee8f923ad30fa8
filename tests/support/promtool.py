"""Debian's ``promtool`` (``make promtool``, scripts/ensure-promtool.sh): the checker Prometheus
ships, run on the alert rules and on real scrapes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PROMTOOL = "/usr/bin/promtool"


def promtool(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    assert shutil.which(PROMTOOL), (
        f"{PROMTOOL} is missing: `make promtool` installs Debian's (package prometheus)"
    )
    return subprocess.run(
        [PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def check_metrics(exposition: str) -> None:
    """``promtool check metrics`` on a scrape's text: exit 0 and no finding at all (its lint
    findings, such as a summary named ``_total``, are printed and exit 3)."""
    done = promtool("check", "metrics", stdin=exposition)
    findings = (done.stdout + done.stderr).strip()
    assert done.returncode == 0 and not findings, (
        f"promtool check metrics exited {done.returncode}:\n{findings}"
    )
