"""Carrying claimed steps out (the worker's jobs): each compensator call outside any transaction
with its lease renewed, its outcome recorded only while the lease holds (fenced by its token),
and, within a batch of a couple of seconds, the unwind's next steps in the same job.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import structlog
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from infra import errors, tracing
from ledger.services.actions import moves
from recovery import compensators, metrics
from recovery.compensators import Outcome
from recovery.models import Unwind, UnwindStep
from recovery.notifications import outbox
from recovery.readers import checks
from recovery.unwinds.advance import advance_locked, unwind_advance_and_claim
from recovery.unwinds.claim import Claim, step_claim
from recovery.unwinds.dispatch import (
    batch_seconds,
    enqueue_advance,
    enqueue_step,
    retry_backoff_seconds,
    step_max_seconds,
    step_timeout_of,
)
from recovery.unwinds.finish import stopped_item_refresh
from recovery.unwinds.state import ENGINE, lock_unwind, planned_step, step_transition

log = structlog.get_logger(__name__)


def step_lease_renew(*, step_id: str, token: int, lease_s: int) -> bool:
    """Push the lease of a step this worker still holds ``lease_s`` seconds out (fenced: the same
    token, still running). Not a state change, so not audited. False when the lease is lost (the
    sweeper took the step back, or the outcome is recorded)."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            # Never wait long behind a lock: a renewal that cannot be written now is tried again.
            cursor.execute("SET LOCAL lock_timeout = '2s'")
        renewed = UnwindStep.objects.filter(
            pk=step_id, status=UnwindStep.Status.RUNNING, lease_token=token
        ).update(lease_expires_at=timezone.now() + timedelta(seconds=lease_s))
    return renewed == 1


class _LeaseRenewal:
    """While this worker calls a step's compensator, a thread of its own renews the step's lease
    every third of it, so a call that runs longer than the lease (a slow Python compensator) is not
    taken over by the sweeper while its worker is alive. A worker that dies takes the thread with
    it and loses the lease as before; a call past ``step_max_seconds`` stops being renewed (and
    RQ's job timeout stops the job)."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._renew, name=f"lease-{claim.step_id}", daemon=True)

    def __enter__(self) -> _LeaseRenewal:
        if self.claim.lease_s > 0:
            self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    def _renew(self) -> None:
        claim = self.claim
        interval = max(claim.lease_s / 3, 0.2)
        deadline = time.monotonic() + step_max_seconds()
        try:
            while not self.stopped.wait(interval):
                if time.monotonic() > deadline:
                    log.warning("unwinds.lease_not_renewed", step_id=claim.step_id, max_s=step_max_seconds())
                    return
                try:
                    if not step_lease_renew(step_id=claim.step_id, token=claim.token, lease_s=claim.lease_s):
                        return  # fenced: whatever this call returns will not be recorded
                except DatabaseError:
                    log.warning("unwinds.lease_renewal_failed", step_id=claim.step_id, exc_info=True)
        finally:
            connection.close()  # this thread's own connection


def _carry_out(claim: Claim | None, *, batch_s: float) -> Outcome | None:
    """Run claimed steps back to back: each step's call happens outside any transaction, and its
    outcome commits (with the claim of the next step, while the batch lasts) before the next call,
    so a crash mid-batch loses at most the step in flight, which its lease and the sweeper recover.
    Returns the first step's outcome."""
    deadline = time.monotonic() + batch_s
    first: Outcome | None = None
    rows: dict[tuple[int, str], Any] = {}
    while claim is not None:
        with _LeaseRenewal(claim), metrics.step_attempt_timer(), claim.span() as span:
            outcome = checks.execute_checked(claim.request, tenant_id=claim.tenant_id, rows=rows)
            tracing.step_outcome(span, outcome=outcome.kind, error=outcome.kind != compensators.DONE)
        if first is None:
            first = outcome
        claim = _step_record(
            step_id=claim.step_id,
            token=claim.token,
            outcome=outcome,
            next_of=claim.unwind_id,
            claim_next=time.monotonic() < deadline,
        )[1]
    return first


def step_run(*, step_id: str, batch_s: float = 0.0) -> Outcome | None:
    """Claim, call the compensator (no transaction or lock held during the call), record; within
    ``batch_s`` seconds, go on with the unwind's next steps in the same process."""
    return _carry_out(step_claim(step_id=step_id), batch_s=batch_s)


def unwind_advance(*, unwind_id: str, batch_s: float | None = None) -> Outcome | None:
    """Advance the unwind and run its steps here, back to back, for up to ``batch_s`` seconds
    (the worker's job for an unwind); then its next step is queued with a job of its own."""
    claim = unwind_advance_and_claim(unwind_id=unwind_id)
    return _carry_out(claim, batch_s=batch_seconds() if batch_s is None else batch_s)


def step_record_outcome(*, step_id: str, token: int, outcome: Outcome) -> UnwindStep | None:
    """Record one attempt's outcome, if this worker still holds the step's lease (fencing: a worker
    that was presumed dead and replaced must not overwrite its replacement's result)."""
    return _step_record(step_id=step_id, token=token, outcome=outcome, next_of=None, claim_next=False)[0]


@transaction.atomic
def _step_record(
    *, step_id: str, token: int, outcome: Outcome, next_of: str | None, claim_next: bool
) -> tuple[UnwindStep | None, Claim | None]:
    """``step_record_outcome``; with ``next_of`` (the step's unwind), the unwind is advanced in the
    same transaction instead of enqueueing an advance: its next step is claimed for the caller
    (``claim_next``), or, when the caller's batch is spent, queued with a job of its own at the
    back of the queue. Either way the next step is in flight when this commits, so the sweeper
    sees a queued step with a live job, not an unwind with nothing in flight."""
    # The unwind is locked before the step, the order unwind_advance_move, unwind_stop and the
    # operator's decisions take them in; read under its lock, its status is current (a stop that
    # committed a moment ago is seen).
    unwind_id = next_of or UnwindStep.objects.filter(pk=step_id).values_list("unwind_id", flat=True).first()
    unwind = lock_unwind(unwind_id) if unwind_id else None
    if unwind is None:
        return None, None
    step = UnwindStep.objects.select_for_update(of=("self",)).select_related("action").get(pk=step_id)
    step.unwind = unwind
    if step.status != UnwindStep.Status.RUNNING or step.lease_token != token:
        log.warning(
            "unwinds.outcome_fenced",
            step_id=step_id,
            token=token,
            current_token=step.lease_token,
            status=step.status,
            outcome=outcome.kind,
        )
        return None, None
    step.action.run = step.unwind.run
    now = timezone.now()
    fence = {"lease_token": token}
    data: dict[str, Any] = {"attempt": step.attempts, "status_code": outcome.status_code}
    base: dict[str, Any] = {"lease_expires_at": None, **_read_checks_updates(step, outcome)}
    stopped = unwind.status == Unwind.Status.CANCELLED
    if outcome.code == compensators.COMPENSATOR_MISSING:
        outcome = Outcome.failed(_missing_compensator_error(unwind, step, outcome), code=outcome.code)
        data["code"] = outcome.code
    elif outcome.code == checks.NOT_RESTORED:
        data["code"] = outcome.code
    if outcome.verified is not None:
        data["verified"] = outcome.verified
    if outcome.kind == compensators.RETRY and step.attempts < step.max_attempts and not stopped:
        delay = retry_backoff_seconds(step.attempts)
        step_transition(
            step,
            to=UnwindStep.Status.QUEUED,
            allowed_from=(UnwindStep.Status.RUNNING,),
            actor=ENGINE,
            kind="step.retry_scheduled",
            reason=outcome.error,
            where=fence,
            updates={
                **base,
                "error": outcome.error,
                "next_attempt_at": now + timedelta(seconds=delay),
                "job_id": "",
            },
            data={**data, "retry_in_s": delay},
        )
        enqueue_step(step.pk, step_timeout_s=step_timeout_of(step.unwind), delay_s=delay)
        _say("unwinds.step_retried", step, reason=outcome.error, retry_in_s=delay)
        return step, None
    to, action_outcome, error = _settled_as(outcome, attempts=step.attempts, stopped=stopped)
    step_transition(
        step,
        to=to,
        allowed_from=(UnwindStep.Status.RUNNING,),
        actor=ENGINE,
        kind=f"step.{to}",
        reason=error,
        where=fence,
        updates={**base, "error": error, "result": outcome.state, "finished_at": now},
        data=data,
    )
    if to != UnwindStep.Status.DONE:
        step.status, step.error = to, error
        outbox.notify_step_failed(step, run=unwind.run, risk=step.action.risk)
        _say(_failure_event(outcome, to=to, stopped=stopped), step, reason=error, code=outcome.code or None)
    moves.action_compensation_finished(
        action=step.action,
        actor=ENGINE,
        outcome=action_outcome,
        step_id=step.pk,
        reason=error,
        state=outcome.state,
    )
    if stopped:
        stopped_item_refresh(unwind)
        return step, None
    return step, _move_on(unwind, step, next_of=next_of, claim_next=claim_next)


def _read_checks_updates(step: UnwindStep, outcome: Outcome) -> dict[str, Any]:
    """The step's ``verified`` and ``read_checks`` after this attempt (recovery.readers.checks):
    this attempt's values, its reads added to the earlier attempts' (the audit of reader calls)."""
    if outcome.checks is None:
        return {}
    earlier = step.read_checks.get("reads", []) if isinstance(step.read_checks, dict) else []
    reads = [*(earlier if isinstance(earlier, list) else []), *outcome.checks.get("reads", [])]
    return {"verified": outcome.verified, "read_checks": {**outcome.checks, "reads": reads[-50:]}}


def _failure_event(outcome: Outcome, *, to: str, stopped: bool) -> str:
    if to == UnwindStep.Status.DRIFTED:
        return "unwinds.step_drifted"
    if outcome.kind == compensators.RETRY:
        return "unwinds.step_not_retried" if stopped else "unwinds.step_given_up"
    return "unwinds.step_failed"


def _say(event: str, step: UnwindStep, *, reason: str, **more: Any) -> None:
    """One structured event per attempt that did not end well (docs/OPERATIONS.md, "What went
    wrong, in the logs"): a retry at WARNING, a step that ends failed, drifted or given up at
    ERROR; named by run, step, tool and attempt, with the reason."""
    level = log.warning if event == "unwinds.step_retried" else log.error
    level(event, **step_log_fields(step), reason=reason, **more)


def step_log_fields(step: UnwindStep) -> dict[str, Any]:
    """What names a step in an ``unwinds.step_*`` event, whichever process logs it (the runner
    here, the sweeper for an expired lease): its run, unwind, id, tool and attempt."""
    return {
        "run_id": step.unwind.run_id,
        "unwind_id": step.unwind_id,
        "step_id": step.pk,
        "tool": step.tool or step.action.tool,
        "attempt": step.attempts,
        "max_attempts": step.max_attempts,
    }


def _settled_as(outcome: Outcome, *, attempts: int, stopped: bool) -> tuple[str, str, str]:
    """The step's final status, its action's compensation outcome and the step's error, for an
    outcome that is not retried (``_step_record``)."""
    if outcome.kind == compensators.DONE:
        to, action_outcome, error = UnwindStep.Status.DONE, "done", ""
    elif outcome.kind == compensators.DRIFTED:
        to, action_outcome, error = UnwindStep.Status.DRIFTED, "drifted", outcome.error
    else:
        to, action_outcome = UnwindStep.Status.FAILED, "failed"
        if outcome.kind == compensators.FAILED:
            error = outcome.error
        elif stopped:
            error = f"Not retried: the unwind was stopped. Attempt {attempts} failed: {outcome.error}"
        else:
            error = f"Gave up after {attempts} attempts: {outcome.error}"
    return to, action_outcome, error


def _move_on(unwind: Unwind, step: UnwindStep, *, next_of: str | None, claim_next: bool) -> Claim | None:
    """The unwind's next move once a step's outcome is recorded (``_step_record``): with
    ``next_of``, advanced in the same transaction (its next step claimed for the caller when
    ``claim_next``); otherwise, or when that advance refuses, an advance job after commit."""
    if next_of is not None:
        try:
            # A savepoint: the outcome just recorded is the compensator's real effect and must
            # commit even when moving the unwind on refuses (a run that left compensating, an
            # approval that cannot be asked); that advance is then retried on its own.
            with transaction.atomic():
                return advance_locked(unwind, claim=claim_next)
        except (errors.SagaError, DatabaseError):
            log.exception("unwinds.advance_failed", unwind_id=step.unwind_id, step_id=step.pk)
    enqueue_advance(step.unwind_id)
    return None


# --- A compensator that no longer exists -------------------------------------------------------


def _missing_compensator_error(unwind: Unwind, step: UnwindStep, outcome: Outcome) -> str:
    """The operator's sentence for a step whose compensating tool nothing serves: named, and
    saying whether it was registered when the unwind was planned (then it was removed since)."""
    was = str(planned_step(unwind, step).get("compensator") or "")
    if was:
        return (
            f"Compensator {step.tool} is no longer registered: it was a {was} compensator when this "
            f"unwind was planned and has since been removed from the policy file (or its code). "
            f"{outcome.error} Register it again and retry this step, or skip it."
        )
    return f"{outcome.error} Register a compensator for {step.tool} and retry this step, or skip it."
