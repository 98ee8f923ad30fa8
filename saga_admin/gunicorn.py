"""The web process's gunicorn hooks (the Procfile's ``-c python:saga_admin.gunicorn``): each start
of the web removes the Prometheus multiprocess files (``ledger.metrics``) of processes that are
gone.

There is no ``child_exit`` hook: prometheus-client's ``mark_process_dead`` removes only the files
of live gauges (``livesum``, ``liveall`` …), and no process keeps one (every gauge is read from
PostgreSQL and Redis at scrape time). The files of an exited worker's counters and histograms must
stay: removing them would make the deployment's counters go backwards.

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
