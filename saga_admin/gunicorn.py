"""The web process's gunicorn hooks (the Procfile's ``-c python:saga_admin.gunicorn``): each start
of the web removes the Prometheus multiprocess files (``ledger.metrics``) of processes that are
gone, and a web worker that exits is marked dead, so its live gauges leave the sum.

Only hooks: every setting stays on the Procfile's command line, where operators look for it.
"""

from __future__ import annotations

from typing import Any


def on_starting(server: Any) -> None:
    """In the master, before any worker is forked: a new deployment's counters start from zero
    (Prometheus's ``rate()`` and ``increase()`` take the reset in their stride)."""
    from ledger import metrics

    removed = metrics.forget_dead_processes()
    server.log.info(
        f"metrics: {removed} file(s) of earlier processes removed from {metrics.MULTIPROCESS_DIR}"
    )


def child_exit(server: Any, worker: Any) -> None:
    """In the master, after a worker exited (or was killed)."""
    from prometheus_client import multiprocess

    from ledger import metrics

    multiprocess.mark_process_dead(worker.pid, path=str(metrics.MULTIPROCESS_DIR))  # type: ignore[no-untyped-call]
