"""Recording a plan (``plan_record``): several planned actions of one run in one transaction, all
or nothing.

Each action goes through ``action_record`` exactly as if it were recorded alone — its policy,
rules and limits, the pauses, the compensation rule, its gate and ``start`` — but in the plan's
transaction, in order: what an earlier action of the plan wrote is what a later one sees (its
limits count it, its pivot lint finds it). The first refusal rolls the whole plan back and goes up
as it is, naming the action (``details.plan_index``).

A plan is idempotent through its actions' keys: all of them new records the plan, all of them
known (each with the same payload) replays it, and a mix is refused (``idempotency_key_reused``):
the plan an agent sent again is the same plan, or another one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from django.db import OperationalError, connection, transaction

from infra import errors
from infra.lock_waits import in_flight_on_lock_timeout, sqlstate
from ledger.audit import Actor
from ledger.models import Action, Run
from ledger.services.actions.compensation import CompensatorCheck
from ledger.services.actions.recording import Gate, RecordedAction, action_record, key_lock_name

log = structlog.get_logger(__name__)

MAX_PLAN_ACTIONS = 100
# A deadlock between two plans (each holding a limit's lock the other one needs next) costs the
# one PostgreSQL picks its transaction; the plan is then recorded again from the start.
DEADLOCK_ATTEMPTS = 3
# What an action of a plan may carry: the fields of ``action_record`` a request sets.
ACTION_FIELDS = frozenset(
    {
        "tool",
        "idempotency_key",
        "target_type",
        "target_id",
        "args",
        "intent",
        "before_snapshot",
        "compensation",
        "via",
        "start",
    }
)


@dataclass(frozen=True)
class RecordedPlan:
    actions: list[Action]  # in the plan's order
    created: bool  # False: an idempotent replay of a plan recorded before
    warnings: list[dict[str, Any]]  # the pivot lint over the plan (each names both actions)


def plan_record(
    *,
    run: Run,
    actor: Actor,
    actions: Sequence[Mapping[str, Any]],
    is_compensator: CompensatorCheck | None = None,
    on_gated: Gate | None = None,
    lock_timeout_ms: int = 5000,
) -> RecordedPlan:
    """Record ``actions`` (each the fields of one ``action_record``) in one transaction, in order.

    Every action needs its own ``idempotency_key``, none twice (422 ``invalid_request``). Its
    keys' locks are taken first, all at once in a fixed order, so two plans sharing keys (a retry
    of a plan still in flight) queue instead of deadlocking; one that waits longer than
    ``lock_timeout_ms`` → ``IdempotencyKeyInFlight``. Then each action is recorded as alone; a
    refusal of any of them (pause, denying rule or limit, compensation, closed run, a key used for
    another payload) rolls every one back and is raised with ``details.plan_index``.

    ``warnings``: the pivot lint of the plan, as each action got it when it was recorded (a step
    that can be undone after an irreversible one, naming both)."""
    fields = _checked_plan(actions)
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            with transaction.atomic():
                return _record_plan(
                    run=run,
                    actor=actor,
                    fields=fields,
                    is_compensator=is_compensator,
                    on_gated=on_gated,
                    lock_timeout_ms=lock_timeout_ms,
                )
        except OperationalError as exc:
            # A deadlock can only be retried from the start of a transaction of our own.
            if sqlstate(exc) != "40P01" or connection.in_atomic_block:
                raise
            log.info("plan.deadlock", run_id=run.pk, attempt=attempt)
    raise errors.ServiceUnavailable(
        "Other plans kept taking the locks this plan needs; nothing was recorded. Retry shortly.",
        details={"run_id": run.pk},
    )


def _checked_plan(actions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The plan's actions as ``action_record``'s fields, or ``ValidationFailed`` naming the first
    action that cannot be one."""
    if not 1 <= len(actions) <= MAX_PLAN_ACTIONS:
        raise errors.ValidationFailed(
            f"A plan has 1 to {MAX_PLAN_ACTIONS} actions; this one has {len(actions)}.",
            details={"errors": [{"field": "actions", "message": f"1 to {MAX_PLAN_ACTIONS} actions"}]},
        )
    seen: dict[str, int] = {}
    fields: list[dict[str, Any]] = []
    for index, action in enumerate(actions):
        unknown = sorted(set(action) - ACTION_FIELDS)
        key = action.get("idempotency_key")
        problem = (
            f"unknown fields {unknown}"
            if unknown
            else "tool is required"
            if "tool" not in action
            else "idempotency_key is required for each action of a plan"
            if not isinstance(key, str) or not key
            else f"idempotency_key {key!r} is also the key of action {seen[key]}"
            if key in seen
            else ""
        )
        if problem:
            raise errors.ValidationFailed(
                f"Action {index} of the plan: {problem}. Nothing was recorded.",
                details={
                    "plan_index": index,
                    "errors": [{"field": f"actions.{index}", "message": problem}],
                },
            )
        seen[str(key)] = index
        fields.append(dict(action))
    return fields


def _record_plan(
    *,
    run: Run,
    actor: Actor,
    fields: list[dict[str, Any]],
    is_compensator: CompensatorCheck | None,
    on_gated: Gate | None,
    lock_timeout_ms: int,
) -> RecordedPlan:
    _lock_keys(run, [str(action["idempotency_key"]) for action in fields], lock_timeout_ms=lock_timeout_ms)
    recorded: list[RecordedAction] = []
    for index, action in enumerate(fields):
        try:
            one = action_record(
                run=run,
                actor=actor,
                is_compensator=is_compensator,
                on_gated=on_gated,
                lock_timeout_ms=lock_timeout_ms,
                **action,
            )
            if recorded and one.created != recorded[0].created:
                raise _mixed_keys(recorded, one)
        except errors.SagaError as exc:
            exc.details = {**exc.details, "plan_index": index}
            raise
        recorded.append(one)
    actions = [one.action for one in recorded]
    warnings = [w for action in actions for w in action.warnings or [] if w.get("code") == "pivot_order"]
    return RecordedPlan(actions=actions, created=recorded[0].created, warnings=warnings)


def _lock_keys(run: Run, keys: list[str], *, lock_timeout_ms: int) -> None:
    """Every key's lock (the one ``action_record`` takes for it, ``key_lock_name``), in one
    statement in sorted order; each record then takes its key's lock again, which this transaction
    already holds."""
    names = sorted({key_lock_name(run.tenant_id, key) for key in keys})
    with (
        in_flight_on_lock_timeout(
            "An action of this plan is still being recorded by another request; retry shortly.",
            details={"idempotency_keys": keys[:MAX_PLAN_ACTIONS]},
        ),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "SET LOCAL lock_timeout = %s; SELECT "
            + ", ".join("pg_advisory_xact_lock(hashtextextended(%s, 0))" for _ in names)
            + "; SET LOCAL lock_timeout TO DEFAULT",
            [f"{int(lock_timeout_ms)}ms", *names],
        )


def _mixed_keys(recorded: list[RecordedAction], one: RecordedAction) -> errors.IdempotencyKeyReused:
    known = [r.action.idempotency_key for r in [*recorded, one] if not r.created]
    new = [r.action.idempotency_key for r in [*recorded, one] if r.created]
    return errors.IdempotencyKeyReused(
        "Some of this plan's idempotency keys were recorded before and some were not: a plan sent "
        "again must be the same plan. Nothing was recorded.",
        details={"known": known, "new": new},
    )
