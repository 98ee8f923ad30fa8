"""A candidate worker for comparison (not what the Procfile runs): RQ's non-forking
``SimpleWorker`` on the same queues, with Django set up once. It keeps the process's database
connection and imports warm from job to job, which the forking worker's work horses cannot.

    python -m bench.simple_worker default compensations notifications
"""

from __future__ import annotations

import os
import sys


def main(queues: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "saga_admin.settings")
    import django

    django.setup()
    from django_rq.workers import get_worker
    from rq import SimpleWorker

    class BenchSimpleWorker(SimpleWorker):
        max_connection_wait_time = 5.0

    worker = get_worker(*queues, worker_class=BenchSimpleWorker)
    worker.work(with_scheduler=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["default", "compensations", "notifications"])
