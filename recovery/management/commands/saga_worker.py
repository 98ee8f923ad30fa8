"""``python manage.py saga_worker``: the Procfile's worker.

An RQ worker on every queue the project uses (compensations, notifications, default: served in
that order) with RQ's scheduler (delayed retries), plus the ticker that runs the periodic duties
(``recovery.scheduling``). Only unwind steps fork a work horse; the other jobs run in this process
(docs/RECOVERY.md, "Which jobs fork"). Run as many as you like, anywhere.
"""

from __future__ import annotations

from typing import Any

import structlog
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django_rq.utils import reset_db_connections
from django_rq.workers import get_worker
from rq import Queue, SimpleWorker
from rq.executions import Execution
from rq.job import Job
from rq.logutils import setup_loghandlers
from rq.worker import WorkerStatus

from infra import metrics, metrics_endpoint, telemetry
from recovery import compensators, jobs, worker_liveness
from recovery.audit_stream import config as audit_stream
from recovery.scheduling import Ticker
from recovery.unwinds import dispatch

# The order is the order served: decisions (unwind steps) first, then what people wait to hear,
# then the rest (bulk chunks, the periodic duties that are jobs: docs/RECOVERY.md).
QUEUES = ("compensations", "notifications", "default")

# The queues whose jobs get a forked work horse: an unwind step runs a compensator, possibly a
# Python one registered in this process, which the fork keeps from leaking into the next job and
# which the worker can SIGKILL however it hangs. Every other job (a notification, a command push,
# a bulk chunk, a periodic job) runs in this process: a fork cost about 40 ms a job against 8 ms
# (docs/BENCHMARKS.md, "Worker classes"), and those jobs are HTTP calls with a deadline and
# database work, under the same hard timeout (SIGALRM, in this main thread).
FORKED_QUEUES = ("compensations",)

# Seconds between RQ's maintenance passes (its registries cleaned, the scheduler's lock taken over
# when its holder died), against RQ's 600.
MAINTENANCE_INTERVAL_S = 30


class SagaWorker(worker_liveness.ResilientWorker):
    # rq backs off up to 60 s between reconnection attempts; a worker should notice a restarted
    # Redis within seconds, because committed decisions are waiting for it.
    max_connection_wait_time = 5.0
    forked_queues: frozenset[str] = frozenset(FORKED_QUEUES)
    # --fork all: every job of those queues forked, whatever it calls (the parent commit's way).
    fork_every_job = False
    _in_process = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # RQ's maintenance pass is also when a worker takes over the scheduler (delayed jobs: the
        # bulk's waiting lanes, retries) from one that died: a SIGKILLed worker's lock lives 61 s,
        # and at RQ's default of 10 minutes its successor moved no delayed job for that long.
        kwargs.setdefault("maintenance_interval", MAINTENANCE_INTERVAL_S)
        super().__init__(*args, **kwargs)

    @property
    def dequeue_timeout(self) -> int:
        # An idle worker waits on its queues this long before it looks up again (heartbeat, the
        # maintenance pass): RQ's 405 s kept a worker with nothing queued from taking over the
        # scheduler whose delayed jobs (a bulk's waiting lanes) were all there was to do.
        return min(super().dequeue_timeout, MAINTENANCE_INTERVAL_S)

    def execute_job(self, job: Job, queue: Queue) -> None:
        # A horse for what isolation buys something for: an unwind whose steps may call Python
        # compensators registered in this process (one indexed query); webhooks and MCP calls are
        # bounded by their deadline and the job's hard timeout, in process (docs/RECOVERY.md).
        if queue.name in self.forked_queues and (
            self.fork_every_job or dispatch.job_calls_code_in_process(job.func_name or "", job.kwargs)
        ):
            # The horse must not share this process's database connection: closed here, opened
            # again by the next job run in this process.
            reset_db_connections()
            super().execute_job(job, queue)
            return
        # As rq's SimpleWorker does, plus what a horse's exit would have cleaned up.
        self._in_process = True
        try:
            close_old_connections()
            execution = self.prepare_execution(job)
            self.perform_job(job, queue, execution)
        finally:
            self._in_process = False
            _job_state_forget()
        self.set_state(WorkerStatus.IDLE)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        # A job run in this process stops the heartbeats until it ends: RQ must not think the
        # worker dead before the job's own timeout (SimpleWorker's rule).
        if self._in_process:
            return SimpleWorker.get_heartbeat_ttl(self, job, working_time)  # type: ignore[arg-type]
        return super().get_heartbeat_ttl(job, working_time)

    def main_work_horse(self, job: Job, queue: Queue) -> None:
        # The horses of one worker, one at a time, share one metrics file (infra.metrics).
        metrics.as_work_horse()
        super().main_work_horse(job, queue)

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        # A work horse leaves with os._exit (no exit handlers): its spans are exported before.
        try:
            return super().perform_job(job, queue, execution)
        finally:
            telemetry.telemetry_flush()


def _job_state_forget() -> None:
    """What one job leaves that the next must not see (a forked horse took it with it): a database
    connection it broke or left past its age, the log context it bound."""
    close_old_connections()
    structlog.contextvars.clear_contextvars()


class Command(BaseCommand):
    help = "Run an RQ worker on every Saga Admin queue, with the scheduler and the periodic jobs."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", default=list(QUEUES))
        parser.add_argument("--name", default=None)
        parser.add_argument("--burst", action="store_true", help="Process what is queued, then exit.")
        parser.add_argument("--no-periodic", action="store_true", help="Do not run the periodic-job ticker.")
        parser.add_argument(
            "--fork",
            default=",".join(FORKED_QUEUES),
            help=(
                "The queues whose jobs may get a forked work horse, given to an unwind whose steps call "
                "Python compensators of this process (comma-separated); 'all': every job forked; 'none'."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # RQ's own lines (an INFO line per job taken and finished) drown what matters: shown from
        # -v 2 (or RQ_LOG_LEVEL=INFO); what went wrong is the project's structured WARNING events.
        level = {2: "INFO", 3: "DEBUG"}.get(options["verbosity"], settings.RQ_LOG_LEVEL)
        setup_loghandlers(level)
        queues = options["queues"] or list(QUEUES)
        # Traces, when OTEL_EXPORTER_OTLP_ENDPOINT is set (infra/telemetry.py); before any fork.
        try:
            telemetry.telemetry_start(service="saga-admin-worker")
        except ImproperlyConfigured as exc:
            raise CommandError(f"Saga Admin will not start: {exc}") from None
        # Work horses are forked from this process: what is built here once (the webhooks' SSL
        # context, httpcore's import) each job would otherwise build again.
        compensators.webhook_client_warm()
        # The audit stream refuses to start a sink it cannot sign for (or cannot parse); the rest of
        # the worker runs. Each problem is said once here, and on the sinks' rows in the dashboard.
        for problem in audit_stream.check_installation():
            self.stderr.write(f"saga_worker: audit stream not started: {problem}")
        metrics_server = self._metrics_server(burst=options["burst"])
        ticker = None
        if not options["no_periodic"] and not options["burst"]:
            ticker = Ticker(run=jobs.periodic_run)
            ticker.start()
        # Outages of Redis are waited out, never a reason to exit (recovery/worker_liveness.py).
        keeper = None if options["burst"] else worker_liveness.RegistrationKeeper()
        if keeper is not None:
            keeper.start()

        def make_worker() -> SagaWorker:
            worker = get_worker(*queues, worker_class=SagaWorker, name=options["name"])
            assert isinstance(worker, SagaWorker)  # django_rq's signature says only Worker
            worker.forked_queues = _forked(options["fork"], queues)
            worker.fork_every_job = options["fork"].strip() == "all"
            return worker

        def run(worker: worker_liveness.ResilientWorker) -> None:
            # Work horses are forked: they must not share the parent's database connection.
            reset_db_connections()
            worker.work(burst=options["burst"], with_scheduler=not options["burst"], logging_level=level)

        try:
            worker_liveness.keep_working(
                make_worker,
                run,
                burst=options["burst"],
                keeper=keeper,
                say=self.stderr.write,
            )
        finally:
            if keeper is not None:
                keeper.stop()
            if ticker is not None:
                ticker.stop()
            if metrics_server is not None:
                metrics_server.shutdown()
                metrics_server.server_close()
            # Stopping, once: what is still buffered may take a moment longer than after a job.
            telemetry.telemetry_flush(timeout_ms=5000)

    def _metrics_server(self, *, burst: bool) -> Any:
        """This worker's own /metrics when SAGA_WORKER_METRICS_PORT is set (not for a burst)."""
        try:
            port = metrics_endpoint.port_from(settings.SAGA["WORKER_METRICS_PORT"])
        except ValueError as exc:
            raise CommandError(f"Saga Admin will not start: {exc}") from None
        if port is None or burst:
            return None
        token = settings.SAGA["METRICS_TOKEN"]
        if not token:
            # As on the web: no token, no endpoint (the rest of the worker runs).
            self.stderr.write(
                f"saga_worker: {metrics_endpoint.PORT_VARIABLE} is set but SAGA_METRICS_TOKEN is not: "
                "the worker's /metrics is served only behind the token, as the web's is; not serving it."
            )
            return None
        try:
            return metrics_endpoint.serve(port=port, token=token)
        except OSError as exc:
            raise CommandError(
                f"Saga Admin will not start: {metrics_endpoint.PORT_VARIABLE}={port}: cannot listen ({exc})."
            ) from None


def _forked(option: str, queues: list[str]) -> frozenset[str]:
    if option.strip() == "all":
        return frozenset(queues)
    if option.strip() == "none":
        return frozenset()
    return frozenset(name.strip() for name in option.split(",") if name.strip())
