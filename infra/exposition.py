"""What both ``/metrics`` endpoints expose of a process's own: the multiprocess files of this
host's processes (ours only), and ``saga_build_info``.

Only the ``saga_`` families of the files are exposed. The files hold every metric any library
defines in any of our processes, and django-rq defines one at import time,
``rq_request_processing_seconds_total``: a summary observed only by django-rq's own stats view
(``/django-rq/metrics/``, superusers, its own exposition), always at zero in ours, and named as
no summary may be (``_total`` is a counter's suffix), so ``promtool check metrics`` refused every
scrape. Nothing in docs/OPERATIONS.md's list is outside the namespace.

``saga_build_info{version, revision, python}`` is 1 on every scrape target, web or worker, so a
rolling deploy shows which target runs what: ``version`` is the installed distribution's,
``revision`` is ``SAGA_REVISION`` (set it at build time: the image's ``SAGA_REVISION`` build
argument, a CI's commit), else the commit of the git checkout the code runs from, else
``unknown``; ``python`` is the interpreter's version.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from infra import metrics

NAMESPACE = "saga_"
DISTRIBUTION = "saga-admin"
REVISION_VARIABLE = "SAGA_REVISION"
_SOURCE = Path(__file__).resolve().parents[1]


# How many times a scrape lists the multiprocess directory when a file went between listing and reading.
READ_ATTEMPTS = 5


class OwnFamilies:
    """The multiprocess files' families in our namespace (``MultiProcessCollector``'s, filtered)."""

    def __init__(self, path: Path) -> None:
        # Not registered anywhere: only read through collect() below.
        self._files = MultiProcessCollector(None, path=str(path))  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        for family in self._read():
            if family.name.startswith(NAMESPACE):
                yield family

    def _read(self) -> list[Metric]:
        # A process that ends removes its file (a command, a work horse: infra.metrics), and one
        # removed between the directory's listing and its read failed the whole scrape with a 500
        # (FileNotFoundError). The listing is taken again: the window is a few microseconds wide.
        for _ in range(READ_ATTEMPTS - 1):
            try:
                return list(self._files.collect())  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                continue
        return list(self._files.collect())  # type: ignore[no-untyped-call]


class BuildInfo:
    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "saga_build_info",
            "Always 1: the version, source revision and Python version this process runs.",
            labels=["version", "revision", "python"],
        )
        info.add_metric([version(), revision(), platform.python_version()], 1.0)
        yield info


@functools.cache
def version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def revision() -> str:
    given = os.environ.get(REVISION_VARIABLE, "").strip()
    if given:
        return given
    if not (_SOURCE / ".git").exists():
        return "unknown"  # an installed distribution: no checkout to ask
    try:
        done = subprocess.run(  # noqa: S603 - a fixed command, once per process
            ["git", "-C", str(_SOURCE), "rev-parse", "HEAD"],  # noqa: S607
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else "unknown"


def process_registry() -> CollectorRegistry:
    """A scrape's registry with what every endpoint exposes: our families of this host's files
    and the build info (the web adds its scrape-time gauges)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(OwnFamilies(metrics.MULTIPROCESS_DIR))
    registry.register(BuildInfo())
    return registry
