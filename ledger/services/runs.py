"""Runs: created by their agent, moved through their states by the agent (complete, fail) and by
the decisions about them (resume, compensate, close). One function per transition, keyword-only
and typed; each is a compare-and-set with its audit event in the same transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict, overload

from django.db import connection, transaction
from django.utils import timezone

from infra import errors, outbound
from ledger.audit import Actor, audit_record
from ledger.models import Action, Run, Tenant
from ledger.policies.resolve import policy_stamp_subquery
from ledger.rules import reason_required
from ledger.scoping import Reach
from ledger.services import pauses
from ledger.transitions import ACTION_TRANSITIONS, RUN_TRANSITIONS, transition

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class PolicyStampAnnotation(TypedDict):
    """What ``run_lock(..., policy_stamp=True)`` annotates the run with: what governs a new action,
    read in the same statement — the PolicyStamp version (None if the stamp row were missing) and
    the tenant's active pauses as ``[[id, agent, tool], …]`` (``ledger.services.pauses``)."""

    policy_stamp: int | None
    active_pauses: list[list[str]]


@overload
def run_lock(run: Run, *, policy_stamp: Literal[True]) -> WithAnnotations[Run, PolicyStampAnnotation]: ...
@overload
def run_lock(run: Run, *, policy_stamp: Literal[False] = ...) -> Run: ...


def run_lock(run: Run, *, policy_stamp: bool = False) -> Run:
    """The run's row, locked for this transaction and read fresh. Narrowed to the reference's reach
    (``ledger.scoping.Reach.of_reference``), so a reference built from a client's run id
    (``Run(pk=…, tenant=…, owner=…)``, ``ledger.selectors.run_reference_for_write``) finds only its
    tenant's (and agent's) run. The tenant is taken over from ``run`` when it is loaded (it cannot
    change), not re-read.
    ``policy_stamp``: also read, in the same statement, the tool-policy stamp (``.policy_stamp``)
    and the tenant's active pauses (``.active_pauses``)."""
    runs = (
        Reach.of_reference(run)
        .filter(Run.objects, run.pk, owner_field="owner")
        .select_for_update(of=("self",))
    )
    if policy_stamp:
        runs = runs.annotate(
            policy_stamp=policy_stamp_subquery(), active_pauses=pauses.active_pauses_subquery()
        )
    locked = runs.first()
    if locked is None:
        raise errors.NotFound.for_id("Run", run.pk)
    if Run.tenant.is_cached(run):
        locked.tenant = run.tenant
    return locked


@pauses.audits_run_refusals
@transaction.atomic
def run_create(
    *,
    tenant: Tenant,
    actor: Actor,
    agent: str,
    request: str,
    external_id: str = "",
    user_id: str = "",
    goal: str = "",
    trace_url: str = "",
    resume_url: str = "",
    metadata: dict[str, Any] | None = None,
) -> Run:
    """A new running run. A ``resume_url`` must pass the outbound guard (``infra.outbound``:
    http(s), a public host or one the operator allows) or nothing is created (422
    ``url_not_allowed``); it is checked again whenever a command is pushed there. An active pause
    covering the agent refuses the run (409 ``paused``; audited on the tenant's chain)."""
    if resume_url:
        # First, before any statement: a refusal changes nothing (and resolving a name holds no
        # transaction open: Django begins one lazily, at the first query).
        outbound.check_url(resume_url, field="resume_url", owner=outbound.owner_of(tenant.pk))
    owner = actor.key.name if actor.key is not None else ""
    pauses.pause_check_run(tenant=tenant, agent=agent, owner=owner)
    now = timezone.now()
    run = Run.objects.create(
        tenant=tenant,
        agent=agent,
        request=request,
        external_id=external_id,
        user_id=user_id,
        goal=goal,
        trace_url=trace_url,
        resume_url=resume_url,
        metadata=metadata or {},
        created_by_key=actor.key,
        # The run belongs to the agent whose key created it (ledger.scoping's owner rule).
        owner=owner,
        last_heartbeat_at=now,
    )
    audit_record(
        tenant=tenant,
        run=run,
        actor=actor,
        kind="run.created",
        subject=run,
        to_state=run.status,
        data={"agent": agent, "external_id": external_id},
    )
    return run


def run_heartbeat(*, run: Run, note: str = "") -> Run:
    """Not a transition and not audited: a heartbeat only proves the agent is alive. One
    statement, narrowed as ``run_lock`` is (``Reach.of_reference``: a reference built for an
    agent's key finds only its own run; else 404), answering the run's status."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ledger_run SET last_heartbeat_at = %s"
            " WHERE id = %s AND tenant_id = %s AND (%s = '' OR owner = %s) RETURNING status",
            [now, run.pk, run.tenant_id, run.owner or "", run.owner or ""],
        )
        row = cursor.fetchone()
    if row is None:
        raise errors.NotFound.for_id("Run", run.pk)
    run.status, run.last_heartbeat_at = row[0], now
    return run


def _run_transition(run: Run, **fields: Any) -> Run:
    """``ledger.transitions.transition`` on the run table, on the run's own audit chain."""
    return transition(run, table=RUN_TRANSITIONS, run=run, **fields)


@transaction.atomic
def run_complete(*, run: Run, actor: Actor, summary: str = "") -> Run:
    return _run_transition(
        run,
        to=Run.Status.SUCCEEDED,
        actor=actor,
        kind="run.completed",
        updates={"summary": summary, "finished_at": timezone.now()},
    )


@transaction.atomic
def run_fail(
    *, run: Run, actor: Actor, error: str, reason: str = "failed", failed_action: Action | None = None
) -> Run:
    """running (or succeeded, for a late verification mismatch) → failed."""
    if failed_action is not None and failed_action.run_id != run.pk:
        raise errors.ValidationFailed(
            "failed_action_id does not belong to this run.", details={"failed_action_id": failed_action.pk}
        )
    updates: dict[str, Any] = {"error": error, "failure_reason": reason, "finished_at": timezone.now()}
    if failed_action is not None:
        updates["failed_action"] = failed_action
    # Not from compensating: that run's unwind owns its outcome (run_compensation_finished), and
    # an agent's late "fail" must not knock it out from under the unwind.
    return _run_transition(
        run,
        to=Run.Status.FAILED,
        actor=actor,
        kind="run.failed",
        reason=error,
        updates=updates,
        data={"reason": reason, "failed_action": getattr(failed_action, "pk", None)},
        allowed_from=[Run.Status.RUNNING, Run.Status.SUCCEEDED],
    )


# The states a run may be cancelled from: a running run, and a failed one (its agent may still be
# at work on an action, or waiting to be resumed; cancelling ends it for good).
CANCELLABLE = (Run.Status.RUNNING, Run.Status.FAILED)

UNKNOWN_WHEN_CANCELLED = "run cancelled while the action was running"
UNKNOWN_WHEN_COMPENSATING = "run started compensating while the action was running"


def _running_actions_to_unknown(run: Run, *, actor: Actor, reason: str) -> list[Action]:
    """The run's actions still ``running`` become ``unknown``, each audited, in the caller's
    transaction. Called right after the run left the agent's hands (cancelled, compensating): the
    agent can no longer report how they ended, so a person must confirm whether each happened
    (reconcile) before anything resumes or undoes the run. The caller has moved the run first (its
    UPDATE holds the row lock that the agent's own action writes take), so no action can start or
    finish in between."""
    moved = list(Action.objects.filter(run_id=run.pk, status=Action.Status.RUNNING).order_by("seq"))
    for action in moved:
        action.run = run
        transition(
            action,
            table=ACTION_TRANSITIONS,
            run=run,
            to=Action.Status.UNKNOWN,
            actor=actor,
            kind="action.outcome_unknown",
            reason=reason,
            updates={"error": f"Outcome unknown: {reason}; confirm whether it happened."},
            allowed_from=[Action.Status.RUNNING],
            data={"run_status": run.status},
        )
    return moved


@transaction.atomic
def run_cancel(*, run: Run, actor: Actor, reason: str) -> Run:
    """running or failed → cancelled; the actions it still had ``running`` become ``unknown`` in
    the same transaction. The run then refuses every write of its agent (``CLOSED_TO_REPORTS``)."""
    reason = reason_required(reason)
    try:
        _run_transition(
            run,
            to=Run.Status.CANCELLED,
            actor=actor,
            kind="run.cancelled",
            reason=reason,
            updates={"finished_at": timezone.now()},
            allowed_from=CANCELLABLE,
        )
    except errors.InvalidTransition as exc:
        raise errors.InvalidTransition(
            run,
            to=Run.Status.CANCELLED,
            current=exc.current,
            message=f"Run {run.pk} is {exc.current}; only a running or failed run can be cancelled.",
        ) from None
    _running_actions_to_unknown(run, actor=actor, reason=UNKNOWN_WHEN_CANCELLED)
    return run


@transaction.atomic
def run_compensation_started(*, run: Run, actor: Actor, reason: str) -> Run:
    """→ compensating. An action still ``running`` becomes ``unknown`` in the same transaction
    (the agent can no longer report it). ``recovery.actions.compensations.unwind_start`` refuses a
    run with running actions before it gets here; this keeps any other path from leaving one
    running forever."""
    _run_transition(run, to=Run.Status.COMPENSATING, actor=actor, kind="run.compensating", reason=reason)
    _running_actions_to_unknown(run, actor=actor, reason=UNKNOWN_WHEN_COMPENSATING)
    return run


@transaction.atomic
def run_compensation_finished(
    *, run: Run, actor: Actor, complete: bool, reason: str = "", partial: bool = False
) -> Run:
    """compensating → compensated, or back to failed when steps are left undone. ``partial``: the
    operator chose to keep some undoable actions; every chosen step settled, so the run is
    ``closed`` (decided, with those actions standing), not ``compensated``."""
    to = Run.Status.COMPENSATED if complete else Run.Status.FAILED
    kind = "run.compensated" if complete else "run.compensation_failed"
    if complete and partial:
        to, kind = Run.Status.CLOSED, "run.partially_compensated"
    updates: dict[str, Any] = {"finished_at": timezone.now()}
    if not complete:
        updates["failure_reason"] = "compensation_failed"
    # Both outcomes only from compensating: "failed" is reachable from running too, and a run that
    # never compensated must not be marked compensation_failed.
    return _run_transition(
        run,
        to=to,
        actor=actor,
        kind=kind,
        reason=reason,
        updates=updates,
        allowed_from=[Run.Status.COMPENSATING],
    )


@transaction.atomic
def run_resume(*, run: Run, actor: Actor, reason: str) -> Run:
    # ``last_heartbeat_at`` stays the agent's own: the resume form and the lost-agent monitor must
    # not mistake an operator's click for a sign of life (the monitor counts the silence from the
    # resume command instead, recovery.actions.periodic.agents_detect_lost).
    return _run_transition(
        run,
        to=Run.Status.RUNNING,
        actor=actor,
        kind="run.resumed",
        reason=reason,
        updates={"finished_at": None},
    )


@transaction.atomic
def run_close(*, run: Run, actor: Actor, reason: str) -> Run:
    reason = reason_required(reason)
    return _run_transition(
        run,
        to=Run.Status.CLOSED,
        actor=actor,
        kind="run.closed",
        reason=reason,
        updates={"finished_at": timezone.now()},
        # Not from compensating: a partial unwind closes its run itself (run_compensation_finished).
        allowed_from=[Run.Status.FAILED, Run.Status.CANCELLED],
    )


def run_closed_states(*, report: bool = False) -> tuple[str, ...]:
    """The run states that refuse an agent's write (``report``: its report on a running action);
    ``run_assert_accepts_writes`` applies them, and the ledger's write functions are handed them."""
    return Run.CLOSED_TO_REPORTS if report else Run.CLOSED_TO_WRITES


def run_assert_accepts_writes(run: Run, *, report: bool = False) -> None:
    """The one closed-to-writes rule (API.md), for every write of an agent: a run that is failed
    (until it is resumed), cancelled, compensating, compensated or closed takes no new actions, no
    action starts and no checkpoints (``Run.CLOSED_TO_WRITES``). A background job that finishes
    after the user cancelled cannot write, and the plan an operator reads holds still.

    ``report``: the agent reporting how an action it already had ``running`` ended (succeed,
    fail). A failed run still takes that (the truth arriving late); a cancelled, compensating,
    compensated or closed one does not (``Run.CLOSED_TO_REPORTS``: its running actions became
    ``unknown`` when it got there). ``run`` must have been read under its row lock."""
    if run.status in run_closed_states(report=report):
        until = " until it is resumed" if run.status == Run.Status.FAILED else ""
        raise errors.RunNotAcceptingActions(
            f"Run {run.pk} is {run.status}; it accepts no more actions or checkpoints{until}.",
            details={"run_id": run.pk, "current": run.status},
        )
