"""RQ jobs: thin, taking ids, each calling one service, each safe to run twice.

Enqueued by dotted path through ``recovery.queueing`` (after commit). The periodic ones are the
ticker's (``recovery.scheduling``, in the ``saga_worker`` command): the housekeeping ones it runs
in its own thread through ``periodic_run``, the others it enqueues on ``default`` when due.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

import structlog
from django.conf import settings
from rq import get_current_job

from ledger import audit_signing
from ledger.services import idempotency
from recovery import sweeper
from recovery.actions import bulk_worker, commands, periodic
from recovery.archive import runner as archive
from recovery.audit_stream import delivery as audit_stream
from recovery.notifications import delivery
from recovery.notifications import prune as notifications_pruning
from recovery.unwinds import dispatch, runner

log = structlog.get_logger(__name__)


def unwind_advance(*, unwind_id: str) -> None:
    # Advances the unwind and runs its steps in this job for up to a batch (one job, not two,
    # per step; the sweeper still calls the one-move service ``recovery.unwinds.advance.unwind_advance_move``).
    runner.unwind_advance(unwind_id=unwind_id)


def step_run(*, step_id: str) -> str | None:
    outcome = runner.step_run(step_id=step_id, batch_s=dispatch.batch_seconds())
    # The outcome kind is kept as the job result: handy in the RQ dashboard, not relied on.
    return outcome.kind if outcome is not None else None


def sweep() -> dict[str, int]:
    report = sweeper.sweep()
    if report.leases_expired or report.reenqueued:
        log.info("jobs.sweep", **vars(report))
    return vars(report)


def approvals_expire() -> int:
    return periodic.approvals_expire()


def agents_detect_lost() -> int:
    return periodic.agents_detect_lost()


def commands_redeliver() -> int:
    return commands.commands_redeliver()


def commands_flag_overdue() -> int:
    return commands.commands_flag_overdue()


def idempotency_prune() -> int:
    return idempotency.idempotency_prune()


def notifications_prune() -> int:
    return notifications_pruning.notifications_prune()


def sessions_prune() -> None:
    """Expired sessions deleted, as ``manage.py clearsessions`` does (the session engine's own
    ``clear_expired``): nothing else removes a session nobody signs out of, such as the one each
    anonymous single sign-on start writes."""
    import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()


def notification_deliver(*, notification_id: str) -> str:
    return delivery.notification_deliver(notification_id=notification_id)


def notifications_sweep() -> dict[str, int]:
    report = sweeper.notifications_sweep()
    if report.reenqueued or report.given_up or report.reminders:
        log.info("jobs.notifications_sweep", **vars(report))
    return vars(report)


def slack_respond(*, response_url: str, message: dict[str, Any]) -> bool:
    return delivery.slack_respond(response_url=response_url, message=message)


def audit_stream_deliver() -> dict[str, int]:
    return audit_stream.audit_stream_deliver()


def audit_heads_sign() -> int:
    return audit_signing.audit_heads_sign()


def runs_archive() -> dict[str, int]:
    """Retention's periodic duty (``recovery.archive.runner``): a bounded pass over every tenant."""
    try:
        result = archive.runs_archive()
    except archive.ArchiveNotConfigured as exc:
        log.error("archive.error", reason="not_configured", message=str(exc))
        return {"archived": 0, "skipped": 0, "errors": 1}
    # Each error was logged once, structured, where it happened (``archive.error``).
    return {"archived": len(result.archived), "skipped": len(result.skipped), "errors": len(result.errors)}


def bulk_advance(*, bulk_id: str) -> str:
    """A chunk of one lane of a bulk decision, then the lane's successor at the back of the queue
    (other operators' jobs run in between; a lane waiting on other lanes' claims looks again a
    little later); a lost job is the periodic ``bulks_sweep``'s to replace."""
    lane = bulk_worker.bulk_advance(bulk_id=bulk_id)
    if lane is bulk_worker.Lane.DONE:
        return "done"
    job = get_current_job()
    delay = bulk_worker.WAIT_S if lane is bulk_worker.Lane.WAIT else None
    return (
        "continued"
        if bulk_worker.bulk_hand_over(bulk_id=bulk_id, from_job=job.id if job else "", delay_s=delay)
        else "replaced"
    )


def bulks_sweep() -> int:
    handed = bulk_worker.bulks_sweep()
    if handed:
        log.info("jobs.bulks_sweep", handed=handed)
    return handed


# The periodic duties the worker's ticker runs in its own process when something is due
# (``recovery.scheduling``): database and Redis work in bounded batches, no job and no fork.
_PERIODIC_INLINE = {
    f"{__name__}.{duty.__name__}": duty
    for duty in (
        sweep,
        approvals_expire,
        notifications_sweep,
        agents_detect_lost,
        commands_redeliver,
        commands_flag_overdue,
        bulks_sweep,
    )
}


def periodic_run(func: str) -> object:
    """Run one inline periodic duty, named as its job is (``recovery.jobs.sweep``)."""
    return _PERIODIC_INLINE[func]()
