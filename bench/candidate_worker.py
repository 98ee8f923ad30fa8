"""A candidate worker for comparison (never what the Procfile runs), to measure a proposed change
before anyone makes it: RQ's non-forking ``SimpleWorker``. Django is set up once and the process
keeps its database connection and imports warm from job to job; the forking worker pays a fork,
a fresh PostgreSQL connection and a work-horse exit for every job. Since the engine runs an
unwind's steps back to back inside one job, that cost is paid once per batch of steps, not once
per step; this candidate shows what is left of the difference.

    python -m bench.candidate_worker default compensations notifications
"""

from __future__ import annotations

import argparse
import os


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("queues", nargs="*", default=["default", "compensations", "notifications"])
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
    import django

    django.setup()
    from django_rq.utils import reset_db_connections
    from django_rq.workers import get_worker
    from rq import SimpleWorker

    from recovery.management.commands.saga_worker import SagaWorker

    class SimpleSagaWorker(SimpleWorker):
        max_connection_wait_time = SagaWorker.max_connection_wait_time

    # django_rq annotates worker_class as type[Worker], but rq's SimpleWorker is a BaseWorker and
    # not a Worker subclass; get_worker only instantiates the class it is given.
    worker = get_worker(*args.queues, worker_class=SimpleSagaWorker)  # type: ignore[arg-type]
    # As saga_worker does (harmless without work horses: the connection reopens on first use).
    reset_db_connections()
    # The periodic jobs run too, as under saga_worker, so both sides carry the same background load.
    from recovery import jobs
    from recovery.scheduling import Ticker

    Ticker(run=jobs.periodic_run).start()
    worker.work(with_scheduler=True)


if __name__ == "__main__":
    main()
