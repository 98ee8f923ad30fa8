"""Refused decisions: every operator decision's refusal audited in a transaction of its own
(``audits_refusals``), a refusal the dashboard makes before any service runs
(``refusal_record``), and the refusal shared by compensating and resuming: actions whose outcome
is not known.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from django.db import DatabaseError, transaction

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Action, Run
from recovery.planner import Plan

log = structlog.get_logger(__name__)


Decision = TypeVar("Decision", bound=Callable[..., Any])


def audits_refusals(decision: str) -> Callable[[Decision], Decision]:
    """A refused operator decision (the loser of a race, a stale tab, four eyes, a missing reason)
    rolls its own transaction back, audit event included, so the log would only show winners.
    Record the refusal afterwards in a transaction of its own: the audit log then has every
    attempt, and the one error still reaches the caller unchanged (API 4xx, dashboard message).

    Written here rather than in the API and the views so both, and any future caller, get it. Inside
    a caller's transaction (a bulk action's per-item savepoint) the event shares that transaction's
    fate; bulk refusals are reported per item in its outcome list."""

    def decorate(fn: Decision) -> Decision:
        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            try:
                return fn(**kwargs)
            except errors.SagaError as exc:
                _record_refusal(decision=decision, exc=exc, **kwargs)
                raise

        return wrapper  # type: ignore[return-value]

    return decorate


def _record_refusal(
    *, decision: str, exc: errors.SagaError, actor: Actor, reason: str = "", **kwargs: Any
) -> None:
    subject = (
        kwargs.get("item")
        or kwargs.get("approval")
        or kwargs.get("step")
        or kwargs.get("unwind")
        or kwargs.get("run")
    )
    if subject is None:
        return
    # A run is its own subject; the others name their run (a step through its unwind).
    run_id = (
        subject.pk
        if isinstance(subject, Run)
        else (getattr(subject, "run_id", None) or subject.unwind.run_id)
    )
    current = str(exc.details.get("current", "")) if isinstance(exc.details, dict) else ""
    log.info(
        "decision.refused",
        decision=decision,
        code=exc.code,
        run_id=run_id,
        subject=subject.pk,
        current=current,
        actor=actor.label,
    )
    try:
        with transaction.atomic():
            run = Run.objects.select_related("tenant").get(pk=run_id)
            audit_record(
                tenant=run.tenant,
                run=run,
                actor=actor,
                kind="decision.refused",
                subject=subject,
                from_state=current,
                to_state=decision,
                reason=exc.message,
                data={"decision": decision, "code": exc.code, "status": exc.status, "reason_given": reason},
            )
    except DatabaseError:
        # The refusal itself must still reach the operator; the log line above keeps the trace.
        log.warning("decision.refusal_not_audited", decision=decision, run_id=run_id, exc_info=True)


def refusal_record(
    *, decision: str, exc: errors.SagaError, actor: Actor, reason: str = "", **subject: Any
) -> None:
    """Audit a decision refused before any service ran (the dashboard refusing a stale tab's POST
    for a decision ``recovery.decisions`` no longer offers), like the services' own refusals."""
    _record_refusal(decision=decision, exc=exc, actor=actor, reason=reason, **subject)


def refuse_unknown_outcomes(plan_or_actions: Plan | list[Action], *, doing: str) -> None:
    unknown = (
        plan_or_actions.unknown_actions
        if isinstance(plan_or_actions, Plan)
        else [a.pk for a in plan_or_actions]
    )
    if unknown:
        raise errors.Conflict(
            f"Cannot {doing}: {len(unknown)} action(s) timed out with an unknown outcome. Reconcile them "
            "first (confirm whether each happened).",
            details={"unknown_action_ids": unknown},
            code="outcome_unknown",
        )
