"""Putting work on RQ, always after the decision is committed, never failing the decision.

PostgreSQL is the source of truth and Redis only carries work: when Redis is unreachable the
enqueue is logged and dropped, and the sweeper (``recovery.sweeper.sweep``) finds the
committed-but-not-carried-out work and enqueues it again once Redis is back.

Jobs are referenced by dotted path so services never import the job module (no import cycle).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import django_rq
import structlog
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job, JobStatus
from rq.queue import Queue

log = structlog.get_logger(__name__)

ALIVE_STATUSES = {
    JobStatus.QUEUED,
    JobStatus.STARTED,
    JobStatus.DEFERRED,
    JobStatus.SCHEDULED,
    JobStatus.CREATED,
    JobStatus.READY_TO_ENQUEUE,
}
# Held by RQ to be run: a worker will take it (or RQ marks it failed), however long it waits.
WAITING_STATUSES = ALIVE_STATUSES - {JobStatus.STARTED}


def enqueue(
    func: str,
    *,
    queue: str = "default",
    delay_s: float | None = None,
    job_timeout: int | None = None,
    job_id: str | None = None,
    **kwargs: Any,
) -> str | None:
    """Enqueue ``func(**kwargs)``; return the job id, or None when Redis could not take it.
    ``job_id``: one from ``new_job_id``, when the caller recorded it before enqueueing."""
    # The job's description is the function's name alone: RQ's default spells out the arguments,
    # and a worker logs the description of every job it takes (a Slack response_url is a secret).
    options: dict[str, Any] = {"kwargs": kwargs, "description": func}
    if job_timeout is not None:
        options["job_timeout"] = job_timeout
    if job_id is not None:
        options["job_id"] = job_id
    try:
        # commit_mode="auto": callers already run after commit (transaction.on_commit), and the
        # job id is wanted now, not when some later transaction commits.
        rq_queue = django_rq.get_queue(queue, commit_mode="auto")
        if delay_s:
            job = rq_queue.enqueue_in(timedelta(seconds=delay_s), func, **options)
        else:
            job = rq_queue.enqueue(func, **options)
    except RedisError as exc:
        # The ids the job names, not its other arguments (a URL may be a secret).
        ids = {name: value for name, value in kwargs.items() if name.endswith("_id")}
        log.warning("queueing.enqueue_failed", job=func, queue=queue, error=str(exc), **ids)
        return None
    return job.id


def enqueue_many(func: str, *, queue: str, kwargs_list: list[dict[str, Any]]) -> list[str] | None:
    """``enqueue`` for many jobs of one function in one Redis round trip (a sweep handing a batch
    back); their ids in order, or None when Redis could not take them."""
    if not kwargs_list:
        return []
    try:
        rq_queue = django_rq.get_queue(queue, commit_mode="auto")
        jobs = rq_queue.enqueue_many([Queue.prepare_data(func, kwargs=kwargs) for kwargs in kwargs_list])
    except RedisError as exc:
        log.warning("queueing.enqueue_failed", job=func, queue=queue, error=str(exc), jobs=len(kwargs_list))
        return None
    return [job.id for job in jobs]


def new_job_id() -> str:
    """A fresh id for a job to be enqueued later (never reused: RQ would overwrite the job)."""
    return uuid.uuid4().hex


def job_state(job_id: str, *, queue: str = "default") -> str | None:
    """The RQ status of a job, ``"missing"`` when Redis does not know it, None when Redis is down."""
    if not job_id:
        return "missing"
    try:
        connection = django_rq.get_connection(queue)
        status = Job.fetch(job_id, connection=connection).get_status(refresh=False)
    except NoSuchJobError:
        return "missing"
    except RedisError:
        return None
    return JobStatus(status).value if status else "missing"


def job_states(job_ids: list[str], *, queue: str = "default") -> list[str] | None:
    """``job_state`` of many jobs in one round trip (the sweeps' batches): each job's RQ status,
    ``"missing"`` for one Redis does not know (or an empty id); None when Redis is down."""
    try:
        connection = django_rq.get_connection(queue)
        pipeline = connection.pipeline(transaction=False)
        for job_id in job_ids:
            pipeline.hget(Job.key_for(job_id or "-"), "status")
        found = pipeline.execute()
    except RedisError:
        return None
    return [
        status.decode()
        if job_id and isinstance(status, bytes)
        else str(status)
        if job_id and status
        else "missing"
        for job_id, status in zip(job_ids, found, strict=True)
    ]


def jobs_not_in_queue(job_ids: list[str], *, queue: str) -> set[str] | None:
    """Of these jobs (said ``queued``), the ones no longer in their queue's list: a worker took
    them off and died before it started them (``job_will_run``). One round trip; None when Redis
    is down."""
    if not job_ids:
        return set()
    try:
        connection = django_rq.get_connection(queue)
        key = Queue(queue, connection=connection).key
        pipeline = connection.pipeline(transaction=False)
        for job_id in job_ids:
            pipeline.lpos(key, job_id)
        found = pipeline.execute()
    except RedisError:
        return None
    return {job_id for job_id, position in zip(job_ids, found, strict=True) if position is None}


def job_is_alive(state: str | None) -> bool:
    return state in {status.value for status in ALIVE_STATUSES}


def job_will_run(job_id: str, *, queue: str = "default", started_within_s: float) -> bool | None:
    """Whether the job is still going to carry out its work: waiting in RQ (however long: a queue
    behind a backlog is not a lost job), or started less than ``started_within_s`` ago (longer, and
    its work horse is presumed dead: RQ itself notices only at its maintenance pass; so too for a
    job a worker took off the queue and never started). False for a finished, failed or unknown
    job; None when Redis is down."""
    if not job_id:
        return False
    try:
        connection = django_rq.get_connection(queue)
        job = Job.fetch(job_id, connection=connection)
        status = job.get_status(refresh=False)
        # A worker takes a job off its queue (into the queue's intermediate list) before it marks
        # it started; one killed in between leaves it "queued" but in no queue, and RQ fails it
        # only at a worker's maintenance pass, ten minutes or more later. Such a job is judged as a
        # started one would be, from when it was first seen taken off (RQ's own first-seen mark of
        # its intermediate list, set here when no one has yet): not from when it was enqueued,
        # which for a job that waited behind a backlog is long before the moment it was taken.
        queue_key = Queue(job.origin, connection=connection).key
        dequeued = status == JobStatus.QUEUED and connection.lpos(queue_key, job.id) is None
        taken_at = None
        if dequeued:
            intermediate = IntermediateQueue(queue_key, connection)
            intermediate.set_first_seen(job.id)
            taken_at = intermediate.get_first_seen(job.id)
    except NoSuchJobError:
        return False
    except RedisError:
        return None
    if status in WAITING_STATUSES and not dequeued:
        return True
    since = taken_at if dequeued else job.started_at
    if (status != JobStatus.STARTED and not dequeued) or since is None:
        return False
    since = since if since.tzinfo else since.replace(tzinfo=UTC)
    return (datetime.now(UTC) - since).total_seconds() < started_within_s
