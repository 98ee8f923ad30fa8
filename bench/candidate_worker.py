"""Candidate workers for comparison (never what the Procfile runs), to measure proposed changes
before anyone makes them:

- ``--class simple``: RQ's non-forking ``SimpleWorker``. Django is set up once and the process
  keeps its database connection and imports warm from job to job; the forking worker pays a
  fork, a fresh PostgreSQL connection and a work-horse exit for every job.
- ``--inline-advance``: an unwind step's job moves the unwind on itself, right after its outcome
  commits, instead of enqueueing a separate ``unwind_advance`` job: one RQ job per step instead
  of two. Applied by wrapping ``recovery.unwinds._enqueue_advance`` in this process only (the
  first advance, enqueued by the web process or service that started the unwind, still goes
  through RQ), so what is measured is exactly the proposed engine change.

    python -m bench.candidate_worker --class simple [--inline-advance] default compensations notifications
"""

from __future__ import annotations

import argparse
import os


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--class", dest="worker_class", choices=["simple", "fork"], default="simple")
    parser.add_argument("--inline-advance", action="store_true")
    parser.add_argument("queues", nargs="*", default=["default", "compensations", "notifications"])
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
    import django

    django.setup()
    from django.db import transaction
    from django_rq.utils import reset_db_connections
    from django_rq.workers import get_worker
    from rq import SimpleWorker

    from recovery import unwinds
    from recovery.management.commands.saga_worker import SagaWorker

    if args.inline_advance:

        def advance_after_commit(unwind_id: str) -> None:
            transaction.on_commit(lambda: unwinds.unwind_advance(unwind_id=unwind_id))

        unwinds._enqueue_advance = advance_after_commit  # type: ignore[assignment]

    class SimpleSagaWorker(SimpleWorker):
        max_connection_wait_time = SagaWorker.max_connection_wait_time

    worker_class = SimpleSagaWorker if args.worker_class == "simple" else SagaWorker
    worker = get_worker(*args.queues, worker_class=worker_class)
    # As saga_worker does: forked work horses must not share the parent's connection.
    reset_db_connections()
    # The periodic jobs run too, as under saga_worker, so both sides carry the same background load.
    from recovery.scheduling import Ticker

    Ticker().start()
    worker.work(with_scheduler=True)


if __name__ == "__main__":
    main()
