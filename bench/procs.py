"""Starting the Procfile's processes (and the L2 no-op app with the same server settings).

The web and worker command lines are read from the repository's Procfile every run, so the
benchmark measures whatever the operating contract says today, not a copy that drifted.
"""

from __future__ import annotations

import http.client
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


def procfile_lines(path: Path = ROOT / "Procfile") -> dict[str, str]:
    lines = {}
    for raw in path.read_text().splitlines():
        if ":" in raw and not raw.lstrip().startswith("#"):
            name, command = raw.split(":", 1)
            lines[name.strip()] = command.strip()
    return lines


def web_command(*, app: str | None = None) -> str:
    """The Procfile's web line, optionally serving another WSGI app with the same settings."""
    command = procfile_lines()["web"]
    if app is not None:
        command, replaced = re.subn(r"saga_admin\.wsgi(:application)?", app, command, count=1)
        if not replaced:
            raise RuntimeError(f"cannot find the WSGI module in the Procfile's web line: {command}")
    return command


def worker_command(*, burst: bool = False) -> str:
    command = procfile_lines()["worker"]
    return f"{command} --burst" if burst else command


def worker_class_name(env: dict[str, str]) -> str:
    """The worker class the Procfile's worker runs: ``--worker-class``, else the class the
    project's own worker command uses, else django-rq's setting or default (rq.Worker)."""
    del env
    command = procfile_lines()["worker"]
    match = re.search(r"--worker-class[= ](\S+)", command)
    if match:
        return match.group(1)
    if "saga_worker" in command:
        from recovery.management.commands import saga_worker

        cls = saga_worker.SagaWorker
        bases = " < ".join(f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__[:3])
        return bases
    from django.conf import settings

    configured = getattr(settings, "RQ", {}).get("WORKER_CLASS")
    if configured:
        return (
            configured
            if isinstance(configured, str)
            else f"{configured.__module__}.{configured.__qualname__}"
        )
    return "rq.worker.Worker"


def expand(command: str, env: dict[str, str]) -> list[str]:
    """The argument list bash makes of a command line in ``env`` (``${PORT:-8000}`` and the like
    expanded, quotes removed): how two web lines are compared."""
    done = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {command}"], env=env, capture_output=True, check=True
    )
    return done.stdout.decode().split("\0")[:-1]


def gunicorn_settings() -> str:
    """The server settings part of the web line (what L2 shares with the app), for the report."""
    parts = shlex.split(procfile_lines()["web"])
    return " ".join(p for p in parts[1:] if not p.startswith("saga_admin.wsgi"))


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: IO[bytes]

    def cpu_seconds(self) -> float:
        """User + system CPU of every live process in this process group (a gunicorn master
        and its workers), from /proc; clock ticks are 100 Hz on Linux."""
        total = 0
        ticks = os.sysconf("SC_CLK_TCK")
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # After "pid (comm)": state ppid pgrp ... utime stime at positions 11 and 12.
            if int(fields[2]) == self.popen.pid:
                total += int(fields[11]) + int(fields[12])
        return total / ticks

    def stop(self, timeout: float = 20) -> None:
        if self.popen.poll() is None:
            # The whole process group: gunicorn's workers, the RQ worker's work horse.
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        self.log.close()


def start(name: str, command: str, env: dict[str, str], log_dir: Path) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = (log_dir / f"{name}.log").open("ab")
    # bash expands ${PORT:-8000}-style defaults exactly as a Procfile runner would.
    popen = subprocess.Popen(  # noqa: S603 - our own Procfile line
        ["bash", "-c", f"exec {command}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return Proc(name=name, popen=popen, log=log)


def warm_http(port: int, path: str, proc: Proc, *, connections: int, timeout: float = 60) -> None:
    """``connections`` concurrent GETs of ``path`` on fresh connections, each until it is answered:
    every worker process the server has gets a first request before anything is timed."""

    def one() -> None:
        wait_http(port, path, proc, timeout=timeout)

    threads = [threading.Thread(target=one) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def wait_http(port: int, path: str, proc: Proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}; see {proc.log.name}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            conn.close()
            if response.status < 500:
                return
            last = f"HTTP {response.status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"{proc.name} did not answer {path} on port {port} within {timeout}s ({last})")
