"""Handing an unwind's work to RQ jobs after commit, and the settings that shape a step's life:
its lease, its retries' backoff, its timeout, and how long one job runs steps back to back.
"""

from __future__ import annotations

import math

from django.db import transaction
from django.utils import timezone

from infra.conf import saga
from ledger.models import Compensator
from recovery import compensators, queueing
from recovery.models import Unwind, UnwindStep

# --- Settings that shape a step's life ---------------------------------------------------------


def step_lease_seconds(*, step_timeout_s: float | None = None) -> int:
    """A step's lease outlives one webhook call, and the worker renews it while a longer call
    (a slow Python compensator) runs (``_LeaseRenewal``), so a live worker never loses its lease
    to the sweeper mid-call; a dead worker's step is taken back within the lease plus a sweep."""
    call = compensators.call_timeout_s(step_timeout_s=step_timeout_s)
    return max(saga().step_lease_s, math.ceil(call) + 1)


def retry_backoff_seconds(attempt: int) -> float:
    base = saga().retry_backoff_base_s
    factor: int = 2 ** max(0, attempt - 1)  # typeshed types int ** int as Any (negative powers)
    return min(saga().retry_backoff_max_s, base * factor)


def step_timeout_of(unwind: Unwind) -> float:
    """The step timeout frozen into the unwind's plan when it started."""
    return float((unwind.plan or {}).get("settings", {}).get("step_timeout_s") or 0)


def batch_seconds() -> float:
    """How long one job keeps running an unwind's steps back to back before it hands the unwind
    to a fresh job at the back of the queue (so concurrent unwinds take turns)."""
    return saga().unwind_batch_s


def step_max_seconds() -> int:
    """The longest one compensator call may run while its worker renews the lease (SAGA
    STEP_MAX_S): past it the lease is no longer renewed and the job is stopped, so a call that
    hangs in a live worker is retried like one whose worker died."""
    return max(saga().step_max_s, 1)


def drive_job_timeout(*, step_timeout_s: float | None = None) -> int:
    """RQ's timeout for a job that runs steps back to back: the batch, then one more step's call
    (a step is only started while the batch lasts, and its call is bounded by the lease, renewed
    for up to ``step_max_seconds``)."""
    longest = max(step_lease_seconds(step_timeout_s=step_timeout_s), step_max_seconds())
    return longest + math.ceil(batch_seconds()) + 5


# --- Enqueueing (after commit) ---------------------------------------------------------------


def enqueue_advance(unwind_id: str) -> None:
    """Hand the unwind to an advance job after the caller's transaction commits; the job runs the
    unwind's steps itself (``unwind_advance``) for up to a batch. The job's id is written on the
    unwind in the caller's transaction, so from the commit on the sweeper knows which job carries
    the advance (one not in Redis yet gets a sweep interval to arrive: ``recovery.sweeper``)."""
    job_id = queueing.new_job_id()
    # Not a state change: which job carries the advance, and since when (for the sweeper).
    Unwind.objects.filter(pk=unwind_id).update(job_id=job_id, updated_at=timezone.now())
    transaction.on_commit(
        lambda: queueing.enqueue(
            "recovery.jobs.unwind_advance",
            queue="compensations",
            job_timeout=drive_job_timeout(),
            job_id=job_id,
            unwind_id=unwind_id,
        )
    )


def enqueue_step(step_id: str, *, step_timeout_s: float, delay_s: float | None = None) -> None:
    def push() -> None:
        job_id = queueing.enqueue(
            "recovery.jobs.step_run",
            queue="compensations",
            delay_s=delay_s,
            job_timeout=drive_job_timeout(step_timeout_s=step_timeout_s),
            step_id=step_id,
        )
        if job_id:
            # Not a state change: remembers which job carries the step, for the sweeper.
            UnwindStep.objects.filter(pk=step_id, status=UnwindStep.Status.QUEUED).update(job_id=job_id)

    transaction.on_commit(push)


# --- Which jobs need a work horse of their own ---------------------------------------------------

# The jobs of an unwind, and the argument naming the unwind or one of its steps.
_UNWIND_JOBS = {"recovery.jobs.unwind_advance": "unwind_id", "recovery.jobs.step_run": "step_id"}


def job_calls_code_in_process(func_name: str, kwargs: dict[str, object]) -> bool:
    """Whether a job may call Python code as a compensator (a policy file's ``python`` row or one
    registered in this process with ``@compensator``): the one kind a forked work horse isolates
    (docs/RECOVERY.md "Which jobs fork"). An unwind whose unfinished steps are each served by a
    webhook or MCP row makes only HTTP calls under their deadline (``infra.deadline``), run as well
    in the worker's process. A job this cannot judge is answered True (forked)."""
    argument = _UNWIND_JOBS.get(func_name)
    key = kwargs.get(argument) if argument else None
    if not isinstance(key, str):
        return True
    where = {"unwind_id": key} if argument == "unwind_id" else {"unwind__steps__pk": key}
    unfinished = UnwindStep.objects.exclude(status__in=UnwindStep.FINISHED).filter(**where)
    served = set(unfinished.values_list("unwind__run__tenant_id", "tool").distinct())
    for tenant_id, tool in served:
        row = compensators.compensator_row(tenant_id=tenant_id, tool=tool)
        if row is None or row.kind not in (Compensator.Kind.WEBHOOK, Compensator.Kind.MCP):
            return True
    return False
