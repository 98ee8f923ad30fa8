"""Runs: created by their agent, moved through their states by the agent (complete, fail) and by
the decisions about them (resume, compensate, close). One function per transition, keyword-only
and typed; each is a compare-and-set with its audit event in the same transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, TypedDict, overload

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from ledger import errors, outbound
from ledger.audit import Actor, audit_record
from ledger.models import Action, Run, Tenant
from ledger.policies import policy_stamp_subquery
from ledger.rules import reason_required
from ledger.transitions import RUN_TRANSITIONS, transition

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class PolicyStampAnnotation(TypedDict):
    """What ``run_lock(..., policy_stamp=True)`` annotates the run with: the PolicyStamp version
    read in the same statement (None if the stamp row were missing)."""

    policy_stamp: int | None


def run_scope(run: Run) -> QuerySet[Run]:
    """The row ``run`` names: its id within ``run.tenant_id`` and, when the instance carries an
    owner (a reference built for an agent's key, ``ledger.selectors.run_reference_for_write``),
    that agent's. Another tenant's or another agent's run is then simply not there."""
    runs = Run.objects.filter(pk=run.pk, tenant_id=run.tenant_id)
    return runs.filter(owner=run.owner) if run.owner else runs


@overload
def run_lock(run: Run, *, policy_stamp: Literal[True]) -> WithAnnotations[Run, PolicyStampAnnotation]: ...
@overload
def run_lock(run: Run, *, policy_stamp: Literal[False] = ...) -> Run: ...


def run_lock(run: Run, *, policy_stamp: bool = False) -> Run:
    """The run's row, locked for this transaction and read fresh. Scoped by ``run_scope``, so a
    reference built from a client's run id (``Run(pk=…, tenant=…, owner=…)``) finds only its
    tenant's (and agent's) run. The tenant is taken over from ``run`` when it is loaded (it cannot
    change), not re-read.
    ``policy_stamp``: also read the tool-policy stamp in the same statement (``.policy_stamp``)."""
    runs = run_scope(run).select_for_update(of=("self",))
    if policy_stamp:
        runs = runs.annotate(policy_stamp=policy_stamp_subquery())
    locked = runs.first()
    if locked is None:
        raise errors.NotFound(f"Run {run.pk} not found.", details={"id": run.pk})
    if Run.tenant.is_cached(run):
        locked.tenant = run.tenant
    return locked


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
    """A new running run. A ``resume_url`` must pass the outbound guard (``ledger.outbound``:
    http(s), a public host or one the operator allows) or nothing is created (422
    ``url_not_allowed``); it is checked again whenever a command is pushed there."""
    if resume_url:
        # First, before any statement: a refusal changes nothing (and resolving a name holds no
        # transaction open: Django begins one lazily, at the first query).
        outbound.check_url(resume_url, field="resume_url")
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
        # The run belongs to the agent whose key created it (ledger.selectors.run_reach).
        owner=actor.key.name if actor.key is not None else "",
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
    # Not a transition and not audited: a heartbeat only proves the agent is alive.
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(last_heartbeat_at=now)
    run.last_heartbeat_at = now
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


@transaction.atomic
def run_cancel(*, run: Run, actor: Actor, reason: str) -> Run:
    return _run_transition(
        run,
        to=Run.Status.CANCELLED,
        actor=actor,
        kind="run.cancelled",
        reason=reason,
        updates={"finished_at": timezone.now()},
    )


@transaction.atomic
def run_compensation_started(*, run: Run, actor: Actor, reason: str) -> Run:
    return _run_transition(
        run, to=Run.Status.COMPENSATING, actor=actor, kind="run.compensating", reason=reason
    )


@transaction.atomic
def run_compensation_finished(*, run: Run, actor: Actor, complete: bool, reason: str = "") -> Run:
    """compensating → compensated, or back to failed when steps are left undone."""
    to = Run.Status.COMPENSATED if complete else Run.Status.FAILED
    updates: dict[str, Any] = {"finished_at": timezone.now()}
    if not complete:
        updates["failure_reason"] = "compensation_failed"
    # Both outcomes only from compensating: "failed" is reachable from running too, and a run that
    # never compensated must not be marked compensation_failed.
    return _run_transition(
        run,
        to=to,
        actor=actor,
        kind="run.compensated" if complete else "run.compensation_failed",
        reason=reason,
        updates=updates,
        allowed_from=[Run.Status.COMPENSATING],
    )


@transaction.atomic
def run_resume(*, run: Run, actor: Actor, reason: str) -> Run:
    now = timezone.now()
    return _run_transition(
        run,
        to=Run.Status.RUNNING,
        actor=actor,
        kind="run.resumed",
        reason=reason,
        updates={"finished_at": None, "last_heartbeat_at": now},
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
    )


def run_assert_accepts_writes(run: Run) -> None:
    """A run that is cancelled, compensating, compensated or closed takes no more actions or
    checkpoints: a background job that finishes after the user cancelled cannot write, and the
    plan an operator reads holds still."""
    if not run.accepts_actions:
        raise errors.RunNotAcceptingActions(
            f"Run {run.pk} is {run.status}; it accepts no more actions or checkpoints.",
            details={"run_id": run.pk, "current": run.status},
        )
