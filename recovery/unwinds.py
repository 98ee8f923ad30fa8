"""The unwind engine: steps persisted in PostgreSQL, carried out one at a time by RQ jobs.

Mechanics (docs/RECOVERY.md tells the whole story):

- ``unwind_create`` freezes the plan into steps (position 0 = newest completed action) and, after
  commit, enqueues the ``unwind_advance`` job, whose id it writes on the unwind (``job_id``) in the
  same transaction.
- ``unwind_advance`` (under the unwind's row lock) looks at the first unfinished step: a step that
  needs approval opens an Approval and pauses the unwind; otherwise the step becomes ``queued``
  and ``step_run`` is enqueued. Only one step is ever in flight. (The sweeper's move; the
  ``unwind_advance`` job claims the step and runs it itself: ``unwind_run_steps`` below.)
- ``step_run`` claims the step (``select_for_update(skip_locked=True)``, status ``queued`` →
  ``running``, a new fencing token and a lease), calls the compensator outside any transaction,
  then records the outcome only if it still holds the lease (same token, still ``running``).
- The worker's jobs do both in a loop (``unwind_run_steps``, ``step_run(batch_s=...)``): the
  ``unwind_advance`` job claims the unwind's first step (``unwind_advance_and_claim``) and runs it,
  and the transaction that records a step's outcome also advances the unwind and claims its next step
  (``pending`` → ``running`` directly: it never waits for a worker), and the job goes on with it
  for up to a batch of a couple of seconds; then the next step is queued with a ``step_run`` job
  at the back of the queue, so concurrent unwinds take turns. A crash mid-batch leaves one
  ``running`` step whose lease expires.
- ``recovery.sweeper.steps_sweep`` (periodic) re-queues steps whose lease expired (worker killed), re-enqueues
  queued steps whose job vanished (Redis restarted), and advances running unwinds with nothing in
  flight whose advance job RQ will not run (it never reached Redis, or its work horse died); one
  still waiting in the queue is left to run.
- When no step is left the unwind finishes: run → ``compensated`` and the item resolved, or run →
  ``failed`` and the item reopened as ``compensation_failed`` / ``state_drift`` listing what is left.

Every state change here is a compare-and-set (or happens under a row lock) with its audit event
in the same transaction; enqueues happen on commit.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

import structlog
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Case, When
from django.utils import timezone

from ledger import errors, ids, upstreams
from ledger.audit import Actor, audit_record
from ledger.conf import saga
from ledger.models import Action, Risk, Run, max_risk
from ledger.policies.resolve import policy_settings_for
from ledger.rules import reason_required
from ledger.services import runs
from ledger.services.actions import moves
from ledger.transitions import transition
from recovery import approvals, compensators, items, notifications, queueing
from recovery.compensators import CompensationRequest, Outcome
from recovery.models import (
    STEP_TRANSITIONS,
    UNWIND_TRANSITIONS,
    Approval,
    RecoveryItem,
    Unwind,
    UnwindStep,
)
from recovery.planner import Plan

log = structlog.get_logger("saga_admin.unwinds")

ENGINE = items.ENGINE
IN_FLIGHT = (UnwindStep.Status.QUEUED, UnwindStep.Status.RUNNING, UnwindStep.Status.AWAITING_APPROVAL)
PROBLEMS = (UnwindStep.Status.FAILED, UnwindStep.Status.DRIFTED)


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


# --- Enqueueing (after commit) ---------------------------------------------------------------


def _enqueue_advance(unwind_id: str) -> None:
    """Hand the unwind to an advance job after the caller's transaction commits; the job runs the
    unwind's steps itself (``unwind_run_steps``) for up to a batch. The job's id is written on the
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


# --- Creating an unwind ----------------------------------------------------------------------


def unwind_create(
    *, run: Run, item: RecoveryItem | None, plan: Plan, actor: Actor, reason: str, automatic: bool = False
) -> Unwind:
    """Freeze ``plan`` into an unwind and its steps (caller holds the transaction and has moved
    the run to ``compensating``)."""
    knobs = policy_settings_for(run.tenant).unwind_settings
    frozen = {**plan.as_dict(), "settings": asdict(knobs)}
    try:
        with transaction.atomic():
            unwind = Unwind.objects.create(
                tenant_id=run.tenant_id,
                run=run,
                item=item,
                on_failure=knobs.on_failure,
                automatic=automatic,
                requested_by=actor.user,
                requested_by_key=actor.key,
                reason=reason,
                plan=frozen,
            )
    except IntegrityError as exc:
        active = Unwind.objects.filter(
            run=run, status__in=[Unwind.Status.RUNNING, Unwind.Status.PAUSED]
        ).first()
        raise errors.InvalidTransition(
            active or run,
            to="compensating",
            current=getattr(active, "status", Unwind.Status.RUNNING),
            message=f"Run {run.pk} already has an unwind in progress.",
        ) from exc
    now = timezone.now()
    for position, planned in enumerate(plan.steps):
        step_id = ids.new_step_id()
        UnwindStep.objects.create(
            id=step_id,
            unwind=unwind,
            action=planned.action,
            position=position,
            tool=planned.tool,
            args=planned.args,
            strategy=planned.strategy,
            requires_approval=planned.requires_approval,
            status=UnwindStep.Status.PENDING if planned.can_undo else UnwindStep.Status.SKIPPED,
            max_attempts=knobs.max_attempts,
            # Stable for the step's whole life: every retry and re-enqueue sends the same key.
            idempotency_key=step_id,
            error="" if planned.can_undo else planned.note,
            finished_at=None if planned.can_undo else now,
        )
    # Steps that wait for a person because their compensator does not reach the upstream that
    # performed the action (recovery.planner): the audit says which, and where each was done.
    mismatched = [{"action_id": s.action.pk, **(s.upstream or {})} for s in plan.steps if s.upstream_mismatch]
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind="unwind.started",
        subject=unwind,
        to_state=unwind.status,
        reason=reason,
        data={
            "steps": len(plan.steps),
            "automatic": automatic,
            "on_failure": knobs.on_failure,
            "tools": [s.tool for s in plan.steps],
            **({"upstream_mismatch": mismatched} if mismatched else {}),
        },
    )
    _enqueue_advance(unwind.pk)
    return unwind


# --- Advancing -------------------------------------------------------------------------------


def step_transition(
    step: UnwindStep,
    *,
    to: str,
    allowed_from: tuple[str, ...],
    actor: Actor,
    kind: str,
    reason: str = "",
    updates: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    where: dict[str, Any] | None = None,
) -> None:
    """Compare-and-set one step from the status the caller holds (``step.status``, read in this
    transaction) and audit it; ``InvalidTransition`` when another process changed it first."""
    transition(
        step,
        table=STEP_TRANSITIONS,
        to=to,
        run=step.unwind.run,
        actor=actor,
        kind=kind,
        reason=reason,
        updates=updates,
        data={"unwind_id": step.unwind_id, "action_id": step.action_id, "tool": step.tool, **(data or {})},
        allowed_from=allowed_from,
        current=step.status,
        where=where,
    )


def unwind_set_status(
    unwind: Unwind,
    *,
    to: str,
    allowed_from: tuple[str, ...],
    actor: Actor,
    kind: str,
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> None:
    """Compare-and-set the unwind (whose row the caller holds locked) from one of
    ``allowed_from`` (each caller's own move, narrower than the table) and audit it."""
    now = timezone.now()
    finished = to in (Unwind.Status.COMPLETED, Unwind.Status.FAILED, Unwind.Status.CANCELLED)
    try:
        with transaction.atomic():
            transition(
                unwind,
                table=UNWIND_TRANSITIONS,
                to=to,
                run=unwind.run,
                actor=actor,
                kind=kind,
                reason=reason,
                updates={"finished_at": now if finished else None},
                data=data,
                allowed_from=allowed_from,
                current=unwind.status,
            )
    except IntegrityError as exc:
        # Reactivating an old unwind while a newer one runs: one active unwind per run.
        raise errors.InvalidTransition(
            unwind,
            to=to,
            current=unwind.status,
            message=f"Run {unwind.run_id} already has another unwind in progress.",
        ) from exc


def _lock_unwind(unwind_id: str) -> Unwind | None:
    return (
        Unwind.objects.select_for_update(of=("self",))
        .select_related("run__tenant", "item")
        .filter(pk=unwind_id)
        .first()
    )


def _all_steps(unwind: Unwind) -> list[UnwindStep]:
    return list(unwind.steps.select_related("action").order_by("position"))


def _advance_locked(unwind: Unwind, *, claim: bool) -> Claim | None:
    """The unwind's next move, under its row lock: nothing (a step is in flight, or the unwind is
    not running), finish, ask for approval, or put the next step in flight. With ``claim`` the
    next step is also claimed for the caller, who runs it; without, its job is enqueued.

    One query finds both what is in flight and what comes next (in-flight rows sort first), rather
    than loading every step with its action on every advance."""
    if unwind.status != Unwind.Status.RUNNING:
        return None
    while True:
        step = (
            unwind.steps.filter(status__in=(*IN_FLIGHT, UnwindStep.Status.PENDING))
            .select_related("action")
            .order_by(Case(When(status=UnwindStep.Status.PENDING, then=1), default=0), "position")
            .first()
        )
        if step is not None and step.status != UnwindStep.Status.PENDING:
            return None  # one step at a time; its own job (or the sweeper) moves it on
        if step is None or (
            unwind.on_failure == Unwind.OnFailure.HALT and unwind.steps.filter(status__in=PROBLEMS).exists()
        ):
            unwind_finish(unwind=unwind, steps=_all_steps(unwind))
            return None
        step.unwind = unwind
        step.action.run = unwind.run
        args_error = planned_step(unwind, step).get("args_error")
        if not args_error:
            break
        # Nothing to run and nothing an approver could approve: the step fails, naming the path
        # its args lack, and the unwind goes on with the next one (or halts).
        step_transition(
            step,
            to=UnwindStep.Status.FAILED,
            allowed_from=(UnwindStep.Status.PENDING,),
            actor=ENGINE,
            kind="step.failed",
            reason=args_error,
            updates={"error": args_error, "finished_at": timezone.now()},
        )
    if step.requires_approval:
        approval = Approval.objects.filter(step=step).first()
        if approval is None or approval.status != Approval.Status.APPROVED:
            _step_request_approval(unwind=unwind, step=step, approval=approval)
            return None
    if not claim:
        _step_queue(unwind=unwind, step=step, actor=ENGINE, kind="step.queued")
        return None
    # Claimed straight from pending: the step never waits for a worker, so there is no "queued"
    # state to record; its "step.started" event says pending → running.
    return _step_start(step, allowed_from=(UnwindStep.Status.PENDING,))


@transaction.atomic
def unwind_advance(*, unwind_id: str) -> Unwind | None:
    """Move the unwind one step forward: the next step is queued and its job enqueued. Safe to
    call any number of times, from any process."""
    unwind = _lock_unwind(unwind_id)
    if unwind is not None:
        _advance_locked(unwind, claim=False)
    return unwind


@transaction.atomic
def unwind_advance_and_claim(*, unwind_id: str) -> Claim | None:
    """As ``unwind_advance``, but the next step is claimed for the caller (a worker that runs it
    now) instead of being handed to a job of its own."""
    unwind = _lock_unwind(unwind_id)
    return _advance_locked(unwind, claim=True) if unwind is not None else None


def _step_queue(
    *,
    unwind: Unwind,
    step: UnwindStep,
    actor: Actor,
    kind: str,
    reason: str = "",
    allowed_from: tuple[str, ...] = (UnwindStep.Status.PENDING,),
    updates: dict[str, Any] | None = None,
) -> None:
    now = timezone.now()
    try:
        step_transition(
            step,
            to=UnwindStep.Status.QUEUED,
            allowed_from=allowed_from,
            actor=actor,
            kind=kind,
            reason=reason,
            updates={"next_attempt_at": now, "job_id": "", **(updates or {})},
        )
    except errors.InvalidTransition:
        return  # another process moved the step first: its own job (or the sweeper) carries it on
    enqueue_step(step.pk, step_timeout_s=step_timeout_of(unwind))


def planned_step(unwind: Unwind, step: UnwindStep) -> dict[str, Any]:
    """The step as the plan froze it when the unwind started ({} for an unwind without one),
    as its approval card shows it: the governing policy, the compensator, the plan's notes."""
    planned_steps = (unwind.plan or {}).get("steps", [])
    # Steps were created in plan order, so the position is the index; checked, not assumed.
    if step.position < len(planned_steps) and planned_steps[step.position].get("action_id") == step.action_id:
        return dict(planned_steps[step.position])
    return next((dict(p) for p in planned_steps if p.get("action_id") == step.action_id), {})


def _planned_risk(unwind: Unwind, step: UnwindStep) -> str:
    return str(planned_step(unwind, step).get("risk") or step.action.risk)


def _step_request_approval(*, unwind: Unwind, step: UnwindStep, approval: Approval | None) -> None:
    if approval is not None and approval.status != Approval.Status.PENDING:
        # OneToOne: a step gets one approval. A refused one was already turned into a failed
        # step; reaching here would mean a retry slipped past step_retry's check.
        raise errors.Conflict(
            f"Step {step.pk}'s approval was {approval.status}; start a new compensation.",
            details={"step_id": step.pk, "approval_id": approval.pk},
            code="approval_not_granted",
        )
    step_transition(
        step,
        to=UnwindStep.Status.AWAITING_APPROVAL,
        allowed_from=(UnwindStep.Status.PENDING,),
        actor=ENGINE,
        kind="step.awaiting_approval",
    )
    unwind_set_status(
        unwind,
        to=Unwind.Status.PAUSED,
        allowed_from=(Unwind.Status.RUNNING,),
        actor=ENGINE,
        kind="unwind.paused",
        data={"waiting_for_step": step.pk},
    )
    if approval is None:
        approvals.approval_request(
            run=unwind.run,
            action=step.action,
            step=step,
            tool=step.tool,
            args=step.args,
            risk=_planned_risk(unwind, step),
            actor=ENGINE,
            requested_by=unwind.requested_by,
            requested_by_key=unwind.requested_by_key,
        )


@transaction.atomic
def step_approval_decided(*, approval: Approval, actor: Actor) -> UnwindStep:
    """The approval of a compensation step was approved, rejected or expired (the approval row is
    already decided, in this transaction). Approved: the step runs with the approved args.
    Rejected or expired: the step fails without running, and the unwind goes on (or halts)."""
    step = UnwindStep.objects.select_related("action").get(pk=approval.step_id)
    unwind = _lock_unwind(step.unwind_id)
    assert unwind is not None
    step.unwind = unwind
    if step.status != UnwindStep.Status.AWAITING_APPROVAL:
        raise errors.InvalidTransition(
            step,
            to="queued",
            current=step.status,
            message=f"Step {step.pk} is {step.status}; it is not waiting for approval.",
        )
    unwind_set_status(
        unwind,
        to=Unwind.Status.RUNNING,
        allowed_from=(Unwind.Status.PAUSED,),
        actor=actor,
        kind="unwind.resumed",
        data={"approval_id": approval.pk, "decision": approval.status},
    )
    if approval.status == Approval.Status.APPROVED:
        edited = approval.approved_args_hash and approval.approved_args_hash != approval.args_hash
        _step_queue(
            unwind=unwind,
            step=step,
            actor=actor,
            kind="step.approved",
            reason=approval.reason,
            allowed_from=(UnwindStep.Status.AWAITING_APPROVAL,),
            updates={"args": approval.approved_args} if edited else None,
        )
        return step
    verdict = "expired without a decision" if approval.status == Approval.Status.EXPIRED else "was rejected"
    step_transition(
        step,
        to=UnwindStep.Status.FAILED,
        allowed_from=(UnwindStep.Status.AWAITING_APPROVAL,),
        actor=actor,
        kind=f"step.approval_{approval.status}",
        reason=approval.reason,
        updates={
            "error": f"Approval {approval.pk} {verdict}: {approval.reason}".strip(),
            "finished_at": timezone.now(),
        },
    )
    # The step never ran, so the action keeps its status (succeeded): nothing was undone.
    _enqueue_advance(unwind.pk)
    return step


# --- Running one step ------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    step_id: str
    unwind_id: str
    token: int
    tenant_id: int
    request: CompensationRequest
    lease_s: int = 0


@transaction.atomic
def step_claim(*, step_id: str) -> Claim | None:
    """Take the step for this worker: None when another worker holds it, it is not due yet, or
    it is no longer queued. The lease token is the fence for recording the outcome."""
    step = (
        UnwindStep.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("unwind__run__tenant", "action")
        .filter(pk=step_id, status=UnwindStep.Status.QUEUED)
        .first()
    )
    if step is None:
        return None
    if step.next_attempt_at is not None and step.next_attempt_at > timezone.now():
        return None
    if step.unwind.status != Unwind.Status.RUNNING:
        return None
    step.action.run = step.unwind.run
    return _step_start(step)


def _step_start(
    step: UnwindStep, *, allowed_from: tuple[str, ...] = (UnwindStep.Status.QUEUED,)
) -> Claim | None:
    """queued (or, claimed by the worker that advanced the unwind, pending) → running with a new
    fencing token and a lease (the caller holds the step's row, or the unwind's lock, and has
    loaded the step's unwind, run, tenant and action)."""
    now = timezone.now()
    token = step.lease_token + 1
    attempt = step.attempts + 1
    lease_s = step_lease_seconds(step_timeout_s=step_timeout_of(step.unwind))
    override = bool((step.result or {}).get("override_drift")) if isinstance(step.result, dict) else False
    try:
        step_transition(
            step,
            to=UnwindStep.Status.RUNNING,
            allowed_from=allowed_from,
            actor=ENGINE,
            kind="step.started",
            updates={
                "lease_token": token,
                "attempts": attempt,
                "lease_expires_at": now + timedelta(seconds=lease_s),
                "started_at": step.started_at or now,
            },
            data={"attempt": attempt, "lease_token": token},
        )
    except errors.InvalidTransition:
        return None  # another worker took it first
    action = step.action
    if action.status in (Action.Status.SUCCEEDED, Action.Status.COMPENSATION_FAILED):
        moves.action_compensation_started(action=action, actor=ENGINE, step_id=step.pk)
    run = step.unwind.run
    request = CompensationRequest(
        step_id=step.pk,
        action_id=action.pk,
        run_id=run.pk,
        tenant=run.tenant.slug,
        tool=step.tool,
        args=step.args,
        target_type=action.target_type,
        target_id=action.target_id,
        before_snapshot=action.before_snapshot,
        after_snapshot=action.after_snapshot,
        attempt=attempt,
        idempotency_key=step.idempotency_key,
        strategy=step.strategy,
        override_drift=override,
        timeout_s=compensators.call_timeout_s(step_timeout_s=step_timeout_of(step.unwind)),
        upstream=upstreams.via_upstream(action.via),
        # A step that requires approval reaches a worker only once approved (_advance_locked).
        person_approved=step.requires_approval,
    )
    return Claim(
        step_id=step.pk,
        unwind_id=step.unwind_id,
        token=token,
        tenant_id=run.tenant_id,
        request=request,
        lease_s=lease_s,
    )


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


def _carry_out(claim: Claim | None, *, batch_s: float) -> Outcome | None:
    """Run claimed steps back to back: each step's call happens outside any transaction, and its
    outcome commits (with the claim of the next step, while the batch lasts) before the next call,
    so a crash mid-batch loses at most the step in flight, which its lease and the sweeper recover.
    Returns the first step's outcome."""
    deadline = time.monotonic() + batch_s
    first: Outcome | None = None
    rows: dict[tuple[int, str], Any] = {}
    while claim is not None:
        with _LeaseRenewal(claim):
            outcome = compensators.execute(claim.request, tenant_id=claim.tenant_id, rows=rows)
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


def unwind_run_steps(*, unwind_id: str, batch_s: float | None = None) -> Outcome | None:
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
    # The unwind is locked before the step, the order unwind_advance, unwind_stop and the
    # operator's decisions take them in; read under its lock, its status is current (a stop that
    # committed a moment ago is seen).
    unwind_id = next_of or UnwindStep.objects.filter(pk=step_id).values_list("unwind_id", flat=True).first()
    unwind = _lock_unwind(unwind_id) if unwind_id else None
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
    base = {"lease_expires_at": None}
    stopped = unwind.status == Unwind.Status.CANCELLED
    if outcome.code == compensators.COMPENSATOR_MISSING:
        outcome = Outcome.failed(_missing_compensator_error(unwind, step, outcome), code=outcome.code)
        data["code"] = outcome.code
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
        return step, None
    if outcome.kind == compensators.DONE:
        to, action_outcome, error = UnwindStep.Status.DONE, "done", ""
    elif outcome.kind == compensators.DRIFTED:
        to, action_outcome, error = UnwindStep.Status.DRIFTED, "drifted", outcome.error
    else:
        to, action_outcome = UnwindStep.Status.FAILED, "failed"
        if outcome.kind == compensators.FAILED:
            error = outcome.error
        elif stopped:
            error = f"Not retried: the unwind was stopped. Attempt {step.attempts} failed: {outcome.error}"
        else:
            error = f"Gave up after {step.attempts} attempts: {outcome.error}"
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
        notifications.notify_step_failed(step, run=unwind.run, risk=step.action.risk)
    moves.action_compensation_finished(
        action=step.action,
        actor=ENGINE,
        outcome=action_outcome,
        step_id=step.pk,
        reason=error,
        state=outcome.state,
    )
    if stopped:
        _stopped_item_refresh(unwind)
        return step, None
    if next_of is not None:
        try:
            # A savepoint: the outcome just recorded is the compensator's real effect and must
            # commit even when moving the unwind on refuses (a run that left compensating, an
            # approval that cannot be asked); that advance is then retried on its own.
            with transaction.atomic():
                return step, _advance_locked(unwind, claim=claim_next)
        except (errors.SagaError, DatabaseError):
            log.exception("unwinds.advance_failed", unwind_id=step.unwind_id, step_id=step.pk)
    _enqueue_advance(step.unwind_id)
    return step, None


# --- Finishing -------------------------------------------------------------------------------


def _left_over(steps: list[UnwindStep]) -> list[dict[str, Any]]:
    return [
        {
            "step_id": s.pk,
            "action_id": s.action_id,
            "tool": s.tool,
            "action_tool": s.action.tool,
            "status": s.status,
            "error": s.error,
        }
        for s in steps
        if s.status in PROBLEMS or s.status == UnwindStep.Status.PENDING
    ]


def unwind_finish(*, unwind: Unwind, steps: list[UnwindStep]) -> Unwind:
    """No step left to run (or halted): settle the run and the recovery item. Caller holds the
    unwind's row lock inside a transaction."""
    left = _left_over(steps)
    complete = not left
    not_undone = [
        {"step_id": s.pk, "action_id": s.action_id, "action_tool": s.action.tool, "error": s.error}
        for s in steps
        if s.status == UnwindStep.Status.SKIPPED
    ]
    # A partial unwind: the plan's undoable actions the operator chose to keep (recovery.planner).
    kept = [
        {"action_id": entry["action_id"], "action_tool": entry["action_tool"]}
        for entry in (unwind.plan or {}).get("kept", [])
    ]
    run = Run.objects.select_for_update().select_related("tenant").get(pk=unwind.run_id)
    summary = (
        f"all {len(steps)} steps settled"
        if complete
        else f"{len(left)} of {len(steps)} steps not compensated: "
        + ", ".join(f"{entry['tool']} ({entry['status']})" for entry in left)
    )
    if kept:
        summary += "; kept as the operator chose: " + ", ".join(entry["action_tool"] for entry in kept)
    unwind_set_status(
        unwind,
        to=Unwind.Status.COMPLETED if complete else Unwind.Status.FAILED,
        allowed_from=(Unwind.Status.RUNNING,),
        actor=ENGINE,
        kind="unwind.completed" if complete else "unwind.failed",
        reason=summary,
        data={"left": left, "not_undone": not_undone, "kept": kept},
    )
    runs.run_compensation_finished(
        run=run, actor=ENGINE, complete=complete, reason=summary, partial=bool(kept)
    )
    if complete:
        items.item_resolve_compensated(unwind=unwind, not_undone=not_undone, kept=kept)
    else:
        drift_only = all(
            entry["status"] == UnwindStep.Status.DRIFTED for entry in left if entry["status"] in PROBLEMS
        )
        has_problem = any(entry["status"] in PROBLEMS for entry in left)
        reason = (
            RecoveryItem.Reason.STATE_DRIFT
            if has_problem and drift_only
            else RecoveryItem.Reason.COMPENSATION_FAILED
        )
        items.item_reopen_after_unwind(unwind=unwind, run=run, reason=reason, error=summary, left=left)
    notifications.notify_unwind_finished(
        unwind,
        run=run,
        summary=summary,
        risk=max_risk(*(s.action.risk for s in steps)) if steps else Risk.LOW,
    )
    return unwind


# --- Operator decisions on a step ------------------------------------------------------------


def _unwind_reactivate(*, unwind: Unwind, actor: Actor, reason: str) -> None:
    """A finished-with-failures unwind picks up again after an operator's retry or skip: the run
    goes back to compensating and the reopened item is claimed again."""
    if unwind.status in (Unwind.Status.RUNNING, Unwind.Status.PAUSED):
        return
    if unwind.status != Unwind.Status.FAILED:
        raise errors.InvalidTransition(unwind, to=Unwind.Status.RUNNING, current=unwind.status)
    run = Run.objects.select_for_update().select_related("tenant").get(pk=unwind.run_id)
    runs.run_compensation_started(run=run, actor=actor, reason=reason)
    unwind_set_status(
        unwind,
        to=Unwind.Status.RUNNING,
        allowed_from=(Unwind.Status.FAILED,),
        actor=actor,
        kind="unwind.reactivated",
        reason=reason,
    )
    item = RecoveryItem.objects.filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
    if item is not None:
        item.run = run
        items.item_claim(item=item, actor=actor, reason=reason)
        if unwind.item_id != item.pk:
            Unwind.objects.filter(pk=unwind.pk).update(item=item)
            unwind.item = item


def _lock_step_for_decision(step: UnwindStep) -> tuple[Unwind, UnwindStep]:
    current = UnwindStep.objects.select_related("action").get(pk=step.pk)
    unwind = _lock_unwind(current.unwind_id)
    assert unwind is not None
    current = UnwindStep.objects.select_for_update(of=("self",)).select_related("action").get(pk=step.pk)
    current.unwind = unwind
    return unwind, current


@transaction.atomic
def step_retry(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    """A failed or drifted step runs again (an operator's "retry anyway": for a drifted snapshot
    restore the reader's drift check is skipped this time). The unwind continues after it."""
    reason = reason_required(reason)
    unwind, current = _lock_step_for_decision(step)
    if current.status not in PROBLEMS:
        raise errors.InvalidTransition(current, to=UnwindStep.Status.PENDING, current=current.status)
    approval = Approval.objects.filter(step=current).first()
    if approval is not None and approval.status in (Approval.Status.REJECTED, Approval.Status.EXPIRED):
        raise errors.Conflict(
            f"Step {current.pk}'s approval {approval.status}: retrying would run it unapproved. Ask for "
            f"the approval again instead (request-again on approval {approval.pk}).",
            details={"step_id": current.pk, "approval_id": approval.pk, "current": approval.status},
            code="approval_not_granted",
        )
    override = current.status == UnwindStep.Status.DRIFTED
    _unwind_reactivate(unwind=unwind, actor=actor, reason=reason)
    step_transition(
        current,
        to=UnwindStep.Status.PENDING,
        allowed_from=PROBLEMS,
        actor=actor,
        kind="step.retry_requested",
        reason=reason,
        updates={
            "attempts": 0,
            "next_attempt_at": None,
            "finished_at": None,
            "job_id": "",
            "result": {"override_drift": True} if override else None,
        },
        data={"override_drift": override, "previous_error": current.error},
    )
    _enqueue_advance(unwind.pk)
    return current


@transaction.atomic
def step_skip(*, step: UnwindStep, actor: Actor, reason: str) -> UnwindStep:
    """The operator leaves a failed or drifted step undone; the unwind continues. The action keeps
    ``compensation_failed``: its effect is still in the world, and the trail says so."""
    reason = reason_required(reason)
    unwind, current = _lock_step_for_decision(step)
    if current.status not in PROBLEMS:
        raise errors.InvalidTransition(current, to=UnwindStep.Status.SKIPPED, current=current.status)
    _unwind_reactivate(unwind=unwind, actor=actor, reason=reason)
    step_transition(
        current,
        to=UnwindStep.Status.SKIPPED,
        allowed_from=PROBLEMS,
        actor=actor,
        kind="step.skipped",
        reason=reason,
        updates={"finished_at": timezone.now()},
        data={"previous_error": current.error},
    )
    _enqueue_advance(unwind.pk)
    return current


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


# --- Stopping an unwind ----------------------------------------------------------------------

STOPPABLE = (Unwind.Status.RUNNING, Unwind.Status.PAUSED)


def _step_entry(step: UnwindStep) -> dict[str, Any]:
    return {
        "step_id": step.pk,
        "action_id": step.action_id,
        "action_seq": step.action.seq,
        "tool": step.tool,
        "action_tool": step.action.tool,
        "status": step.status,
        "error": step.error,
    }


def _stop_report(steps: list[UnwindStep], *, by: str, reason: str, at: str) -> tuple[str, dict[str, Any]]:
    """What a stopped unwind undid and did not (a sentence for the item, the details for the
    queue, the run page and the API)."""
    undone = [_step_entry(s) for s in steps if s.status == UnwindStep.Status.DONE]
    running = [_step_entry(s) for s in steps if s.status == UnwindStep.Status.RUNNING]
    not_undone = [
        _step_entry(s) for s in steps if s.status not in (UnwindStep.Status.DONE, UnwindStep.Status.RUNNING)
    ]

    def names(entries: list[dict[str, Any]], *, status: bool = False) -> str:
        return ", ".join(
            f"{e['action_tool']} (#{e['action_seq']}{', ' + e['status'] if status else ''})" for e in entries
        )

    summary = f"Compensation stopped by {by}: {reason}. Undone: {names(undone) or 'nothing'}."
    if not_undone:
        summary += f" Not undone: {names(not_undone, status=True)}."
    if running:
        summary += (
            f" Still running when stopped: {names(running)} (its outcome is recorded when the call returns)."
        )
    details = {
        "by": by,
        "reason": reason,
        "at": at,
        "undone": undone,
        "not_undone": not_undone,
        "running": running,
    }
    return summary, details


def _step_stopped(step: UnwindStep, *, actor: Actor, reason: str) -> None:
    """A step in flight when its unwind stops (the caller holds the unwind's and the step's rows):
    one waiting for its approval or its first attempt goes back to pending (never started, its
    action still stands; a pending approval is withdrawn); one waiting to be retried fails (an
    earlier attempt may have acted: the action is compensation_failed, for a person to check); a
    running one is left to finish (its outcome is recorded, and nothing starts after it)."""
    note = f"the unwind was stopped: {reason}"
    if step.status == UnwindStep.Status.AWAITING_APPROVAL:
        approval = Approval.objects.filter(step=step, status=Approval.Status.PENDING).first()
        if approval is not None:
            approvals.approval_withdraw(approval=approval, actor=actor, reason=note)
    if step.status == UnwindStep.Status.AWAITING_APPROVAL or (
        step.status == UnwindStep.Status.QUEUED and not step.attempts
    ):
        step_transition(
            step,
            to=UnwindStep.Status.PENDING,
            allowed_from=(step.status,),
            actor=actor,
            kind="step.stopped",
            reason=reason,
            updates={"next_attempt_at": None, "job_id": ""},
        )
    elif step.status == UnwindStep.Status.QUEUED:
        error = f"Not retried: the unwind was stopped. Attempt {step.attempts} failed: {step.error}"
        step_transition(
            step,
            to=UnwindStep.Status.FAILED,
            allowed_from=(UnwindStep.Status.QUEUED,),
            actor=actor,
            kind="step.stopped",
            reason=reason,
            updates={"error": error, "next_attempt_at": None, "job_id": "", "finished_at": timezone.now()},
        )
        moves.action_compensation_finished(
            action=step.action, actor=actor, outcome="failed", step_id=step.pk, reason=error
        )


@transaction.atomic
def unwind_stop(*, unwind: Unwind, actor: Actor, reason: str) -> Unwind:
    """Stop a running (or paused) unwind between steps: no step starts after this commits; a step
    whose compensator call is in flight finishes and its outcome is recorded. The unwind becomes
    ``cancelled`` ("Stopped"), the run leaves ``compensating`` (back to ``failed``), and the
    recovery item goes back to the queue (open), naming what was undone and what was not, so a
    person decides again (compensate what is left, resume or close). A finished unwind → 409."""
    reason = reason_required(reason)
    locked = _lock_unwind(unwind.pk)
    if locked is None:
        raise errors.NotFound(f"Unwind {unwind.pk} not found.", details={"id": unwind.pk})
    if locked.status not in STOPPABLE:
        raise errors.InvalidTransition(
            locked,
            to=Unwind.Status.CANCELLED,
            current=locked.status,
            message=f"Unwind {locked.pk} is {locked.status}; only a running or paused unwind can be stopped.",
        )
    in_flight = list(
        UnwindStep.objects.select_for_update(of=("self",))
        .select_related("action")
        .filter(unwind=locked, status__in=IN_FLIGHT)
        .order_by("position")
    )
    for step in in_flight:
        step.unwind = locked
        step.action.run = locked.run
        _step_stopped(step, actor=actor, reason=reason)
    steps = _all_steps(locked)
    summary, details = _stop_report(steps, by=actor.label, reason=reason, at=timezone.now().isoformat())
    unwind_set_status(
        locked,
        to=Unwind.Status.CANCELLED,
        allowed_from=STOPPABLE,
        actor=actor,
        kind="unwind.stopped",
        reason=reason,
        data=details,
    )
    run = Run.objects.select_for_update().select_related("tenant").get(pk=locked.run_id)
    runs.run_compensation_finished(run=run, actor=actor, complete=False, reason=summary)
    item = RecoveryItem.objects.filter(run=run, status__in=RecoveryItem.UNRESOLVED).first()
    items.item_reopen_after_unwind(
        unwind=locked,
        run=run,
        reason=item.reason if item is not None else RecoveryItem.Reason.MANUAL,
        error=summary,
        left=details["not_undone"] + details["running"],
        details={"stopped": details},
    )
    return locked


def _stopped_item_refresh(unwind: Unwind) -> None:
    """The step that was running when its unwind stopped has finished: its item (if it still
    waits for a decision about this unwind) says what happened to it."""
    item = (
        RecoveryItem.objects.select_for_update()
        .filter(run_id=unwind.run_id, status__in=RecoveryItem.UNRESOLVED)
        .first()
    )
    stopped = (item.details or {}).get("stopped") if item is not None else None
    if item is None or not isinstance(stopped, dict) or item.details.get("unwind_id") != unwind.pk:
        return
    summary, details = _stop_report(
        _all_steps(unwind),
        by=str(stopped.get("by", "")),
        reason=str(stopped.get("reason", "")),
        at=str(stopped.get("at", "")),
    )
    items.item_open_or_update(
        run=unwind.run,
        reason=item.reason,
        actor=ENGINE,
        error=summary,
        details={"left": details["not_undone"] + details["running"], "stopped": details},
    )


# --- Asking again for a step's approval --------------------------------------------------------


@transaction.atomic
def step_approval_ask_again(*, approval: Approval, actor: Actor, reason: str) -> Approval:
    """The step whose approval expired or was rejected (so it failed without running) waits for a
    new approval of the same tool and args, linked to the old one. Only once its unwind has
    finished its other steps (``failed``: it stopped with this step left): the unwind picks up
    again, paused on this step, and the run goes back to compensating. ``approval`` is locked
    and checked by ``approvals.approval_lock_for_asking_again``."""
    if approval.step_id is None:
        raise errors.InvalidTransition(
            approval,
            to=Approval.Status.PENDING,
            current=approval.status,
            message=f"Approval {approval.pk} no longer belongs to a step; it was asked again already.",
        )
    unwind, step = _lock_step_for_decision(UnwindStep(pk=approval.step_id))
    step.action.run = unwind.run
    if step.status != UnwindStep.Status.FAILED:
        raise errors.InvalidTransition(
            step,
            to=UnwindStep.Status.AWAITING_APPROVAL,
            current=step.status,
            message=f"Step {step.pk} is {step.status}; only a step that failed for want of approval can ask again.",
        )
    if unwind.status != Unwind.Status.FAILED:
        why = (
            "was stopped; start a new compensation to undo what is left"
            if unwind.status == Unwind.Status.CANCELLED
            else f"is still {unwind.status}; ask again once it has finished its other steps"
        )
        raise errors.InvalidTransition(
            unwind, to=Unwind.Status.RUNNING, current=unwind.status, message=f"Unwind {unwind.pk} {why}."
        )
    _unwind_reactivate(unwind=unwind, actor=actor, reason=reason)
    step_transition(
        step,
        to=UnwindStep.Status.AWAITING_APPROVAL,
        allowed_from=(UnwindStep.Status.FAILED,),
        actor=actor,
        kind="step.approval_requested_again",
        reason=reason,
        updates={"error": "", "finished_at": None},
        data={"previous_approval_id": approval.pk, "previous_error": step.error},
    )
    unwind_set_status(
        unwind,
        to=Unwind.Status.PAUSED,
        allowed_from=(Unwind.Status.RUNNING,),
        actor=ENGINE,
        kind="unwind.paused",
        data={"waiting_for_step": step.pk},
    )
    return approvals.approval_ask_again(previous=approval, actor=actor, reason=reason, step=step)
