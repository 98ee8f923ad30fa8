"""Recording a planned action (``action_record``), idempotently per tenant and idempotency key.

Two paths end in the same write, one call of ``saga_action_record``: the fast path, one round
trip with this process's policies for the tenant when the action needs no count of its limits, no
look at the registered compensators and no gate; and the checked path, every check in Python in
one transaction under the key's and the run's locks, for everything else (and whenever the
database answers "checks"). A key used before is an idempotent replay of what it recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from infra import errors, tracing
from infra.hashing import canonical_json_bytes
from infra.lock_waits import in_flight_on_lock_timeout
from ledger.audit import Actor
from ledger.models import Action, ActionClass, ApprovalMode, Run, Tenant
from ledger.policies.resolve import ResolvedPolicy, policy_resolve, policy_stamp_cached
from ledger.rules import COMPENSATABLE_CLASSES, NOT_A_PIVOT, pivot_order_warning
from ledger.services import limits, pauses, writes
from ledger.services.actions.compensation import Compensation, CompensatorCheck, compensation_for
from ledger.services.actions.payload import ActionCall, canonical_payload_hash, new_action_row, record_payload
from ledger.services.runs import run_assert_accepts_writes, run_lock, run_scope
from ledger.tool_names import check_tool_name


def pivot_warnings_for_new(
    *, run: Run, action_class: str, tool: str, action_id: str, seq: int
) -> list[dict[str, Any]]:
    """The pivot rule (``ledger.rules``) for an action about to be recorded as ``seq``."""
    if action_class not in COMPENSATABLE_CLASSES:
        return []
    # Two columns, no model instance: this runs on every append of a compensatable action.
    pivot = (
        Action.objects.filter(run=run, action_class=ActionClass.EXTERNAL_IRREVERSIBLE)
        .exclude(status__in=NOT_A_PIVOT)
        .order_by("seq")
        .values_list("pk", "tool", "seq")
        .first()
    )
    if pivot is None:
        return []
    pivot_id, pivot_tool, pivot_seq = pivot
    return [
        pivot_order_warning(
            action_id=action_id,
            tool=tool,
            seq=seq,
            pivot_id=pivot_id,
            pivot_tool=pivot_tool,
            pivot_seq=pivot_seq,
        )
    ]


@dataclass(frozen=True)
class RecordedAction:
    action: Action
    created: bool  # False: an idempotent replay of an existing action


# A gate a new action that needs approval passes through in the record's own transaction (the
# recovery layer moves it to awaiting_approval and opens its approval).
Gate = Callable[[Action], None]


@tracing.traced_tool_call  # an execute_tool span, when traces are on (infra.tracing)
def action_record(
    *,
    run: Run,
    actor: Actor,
    tool: str,
    idempotency_key: str,
    target_type: str = "",
    target_id: str = "",
    args: Any = None,
    intent: dict[str, Any] | None = None,
    before_snapshot: Any = None,
    compensation: dict[str, Any] | None = None,
    via: dict[str, str] | None = None,
    is_compensator: CompensatorCheck | None = None,
    lock_timeout_ms: int = 5000,
    start: bool = False,
    on_gated: Gate | None = None,
) -> RecordedAction:
    """Record a planned action, idempotently per (tenant, idempotency key).

    Same key and payload → the existing action (with its result once succeeded); another payload
    → ``IdempotencyKeyReused``. Concurrent duplicates serialise on an advisory lock for the key:
    the first inserts, the rest then see its row; one that waits longer than ``lock_timeout_ms``
    for a stuck first request gets ``IdempotencyKeyInFlight``.

    A new action's compensation is checked against its policy (``compensation_for``) and, with
    ``is_compensator``, the agent-named tool against the registered compensators; a replay is not
    checked again (it returns what was accepted).

    ``via``: the gateway that forwards the call and the upstream that performs it
    (``ledger.upstreams``), stored on the action and part of its payload.

    ``start``: a new action that needs no approval is also started (running, attempt 1, audited
    as ``action.started``) in the same transaction; one that needs approval is left planned for
    its gate. ``start`` is not part of the payload: a replay, with or without it, returns the
    action as it is now and changes nothing. ``on_gated``: called in the record's transaction
    with a new action that needs approval.

    The write is one call of ``saga_action_record`` (``ledger.services.writes``): with this
    process's policies for the tenant, an action that needs neither a count of its limits, nor a
    look at the registered compensators, nor a gate is recorded in that one round trip. The
    function answers "checks" instead of writing when the policies changed since, a pause is
    active in the tenant or the run has a pivot; then, and for everything else, the checked path
    decides in one transaction under the same locks and ends with the same call.
    """
    # The one tool-name rule (ledger.tool_names), for the tool and an agent-named compensating
    # tool alike, before anything is read or written: a refused name changes nothing.
    check_tool_name(tool, field="tool")
    if compensation is not None:
        check_tool_name(compensation.get("tool"), field="compensation.tool")
    args = {} if args is None else args
    # The args' canonical JSON, made once: hashed into the payload hash and sent to the database as
    # they are (a megabyte of args is not encoded again for each).
    args_json = canonical_json_bytes(args)
    payload_hash = canonical_payload_hash(
        tool=tool,
        target_type=target_type,
        target_id=target_id,
        args_json=args_json,
        compensation=compensation,
        via=via,
    )
    call = ActionCall(
        run=run,
        actor=actor,
        tool=tool,
        idempotency_key=idempotency_key,
        target_type=target_type,
        target_id=target_id,
        args=args,
        args_json=args_json,
        intent=intent or {},
        before_snapshot=before_snapshot,
        compensation=compensation,
        via=via,
        payload_hash=payload_hash,
        start=start,
        lock_timeout_ms=lock_timeout_ms,
    )
    try:
        with in_flight_on_lock_timeout(
            "An action with this idempotency key is still being recorded; retry shortly.",
            details={"idempotency_key": idempotency_key},
        ):
            recorded = _record_at_once(call, is_compensator=is_compensator, on_gated=on_gated)
            if recorded is None:
                with transaction.atomic():
                    recorded = _record_checked(call, is_compensator=is_compensator, on_gated=on_gated)
            return recorded
    except IntegrityError:
        # Only reachable if a writer bypassed the advisory lock; the row exists now.
        existing = (
            Action.objects.filter(tenant_id=run.tenant_id, idempotency_key=idempotency_key).order_by().first()
        )
        if existing is None:
            raise
        return RecordedAction(_replay(existing, run=run, payload_hash=payload_hash), created=False)


def _tenant_of(run: Run) -> Tenant:
    # A reference to the tenant is all the policies need (its id); loading it would cost a query.
    return run.tenant if Run.tenant.is_cached(run) else Tenant(pk=run.tenant_id)


def key_lock_name(tenant_id: int, idempotency_key: str) -> str:
    """The advisory lock an idempotency key's writers serialise on. ``saga_action_record`` builds
    the same name in SQL (``ledger/sql``); a test holds this one and sees the function wait."""
    return f"action-key:{tenant_id}:{idempotency_key}"


def _recording_agent(call: ActionCall, run: Run) -> str:
    """Who the action is counted against (``Action.owner``, limits ``per: agent``): the
    authenticated key's name, else the run's agent."""
    return call.actor.key.name if call.actor.key is not None else run.owner


def _record_at_once(
    call: ActionCall, *, is_compensator: CompensatorCheck | None, on_gated: Gate | None
) -> RecordedAction | None:
    """The one-round-trip record, or None when the checked path must decide."""
    stamp = policy_stamp_cached(call.run.tenant_id)
    if stamp is None:
        return None
    try:
        policy, rule = policy_resolve(tenant=_tenant_of(call.run), tool=call.tool, stamp=stamp).with_args(
            call.args
        )
        if policy.limits or (policy.requires_approval and on_gated is not None):
            return None
        undo = _compensation(policy, call, is_compensator=is_compensator, stamp=stamp)
    except errors.SagaError:
        # A refusal (a deny rule, a compensation the policy does not allow) is decided after the
        # key's replay check, as the checked path does.
        return None
    owner = _recording_agent(call, call.run)
    action, events = new_action_row(call, policy=policy, rule=rule, exceeded=None, undo=undo, owner=owner)
    answer = writes.call(
        "saga_action_record",
        {
            **record_payload(call, action, events),
            "stamp": stamp,
            "pivot_class": ActionClass.EXTERNAL_IRREVERSIBLE
            if policy.action_class in COMPENSATABLE_CLASSES
            else None,
            "not_a_pivot": list(NOT_A_PIVOT),
        },
    )
    outcome = answer["outcome"]
    if outcome == "checks":
        return None
    if outcome == "replay":
        existing = writes.action_from_row(answer["action"])
        replayed = _replay(
            existing, run=call.run, payload_hash=call.payload_hash, reachable=answer["reachable"]
        )
        return RecordedAction(replayed, created=False)
    if outcome == "not_found":
        raise errors.NotFound.for_id("Run", call.run.pk)
    if outcome == "closed":
        run_assert_accepts_writes(Run(pk=call.run.pk, status=answer["current"]))
    if outcome != "created":
        raise RuntimeError(f"saga_action_record answered {outcome!r}")
    action.seq = answer["seq"]
    return RecordedAction(action, created=True)


def _record_checked(
    call: ActionCall, *, is_compensator: CompensatorCheck | None, on_gated: Gate | None
) -> RecordedAction:
    """The record with every check in Python, in the caller's transaction: the key's lock and
    replay, the run's lock (with the policy stamp and the pauses), pauses, the policy's rules and
    limits, the compensators, the pivot; then the write, ``saga_action_record`` told the checks
    are done."""
    run = call.run
    with connection.cursor() as cursor:
        # Three statements, one round trip (the client-side-binding cursor sends them together,
        # in order): the timeout applies to the key's lock wait only.
        cursor.execute(
            "SET LOCAL lock_timeout = %s;"
            " SELECT pg_advisory_xact_lock(hashtextextended(%s, 0));"
            " SET LOCAL lock_timeout TO DEFAULT",
            [f"{int(call.lock_timeout_ms)}ms", key_lock_name(run.tenant_id, call.idempotency_key)],
        )
    existing = (
        Action.objects.filter(tenant_id=run.tenant_id, idempotency_key=call.idempotency_key)
        .order_by()
        .first()
    )
    if existing is not None:
        return RecordedAction(_replay(existing, run=run, payload_hash=call.payload_hash), created=False)
    locked = run_lock(run, policy_stamp=True)
    run_assert_accepts_writes(locked)
    # An operator's pause (kill switch) of this tool or agent: 409 paused, nothing recorded.
    pauses.pause_check_action(run=locked, tool=call.tool, active=locked.active_pauses)
    base_policy = policy_resolve(tenant=locked.tenant, tool=call.tool, stamp=locked.policy_stamp)
    # The policy's rules on the args (first match wins, failing closed on types; a deny rule →
    # 403, nothing recorded), then its limits, counted under a lock per limit scope
    # (``ledger.services.limits``).
    policy, rule = base_policy.with_args(call.args)
    owner = _recording_agent(call, locked)
    exceeded = limits.limits_check(
        policy=policy,
        tenant_id=locked.tenant_id,
        tool=call.tool,
        owner=owner,
        args=call.args,
        now=timezone.now(),
    )
    if exceeded is not None and not policy.requires_approval:
        policy = replace(policy, approval=ApprovalMode.MANUAL)
    undo = _compensation(policy, call, is_compensator=is_compensator, stamp=locked.policy_stamp)
    action, events = new_action_row(call, policy=policy, rule=rule, exceeded=exceeded, undo=undo, owner=owner)
    action.warnings[:0] = pivot_warnings_for_new(
        run=locked,
        action_class=policy.action_class,
        tool=call.tool,
        action_id=action.pk,
        seq=locked.action_count + 1,
    )
    answer = writes.call("saga_action_record", {**record_payload(call, action, events), "checked": True})
    if answer["outcome"] != "created":
        # Under the key's lock and the run's, with the run checked: nothing else can be answered.
        raise RuntimeError(f"saga_action_record answered {answer['outcome']!r} to a checked record")
    action.seq = answer["seq"]
    locked.audit_head, locked.action_count = answer["audit_head"], action.seq
    action.run = locked
    if action.requires_approval and on_gated is not None:
        on_gated(action)
    return RecordedAction(action, created=True)


def _compensation(
    policy: ResolvedPolicy, call: ActionCall, *, is_compensator: CompensatorCheck | None, stamp: int | None
) -> Compensation:
    return compensation_for(
        policy,
        tool=call.tool,
        target_type=call.target_type,
        target_id=call.target_id,
        args=call.args,
        compensation=call.compensation,
        is_compensator=is_compensator,
        stamp=stamp,
    )


def _replay(existing: Action, *, run: Run, payload_hash: str, reachable: bool | None = None) -> Action:
    """The action a key was first used for, when the caller may have it. ``reachable``: whether
    the caller reaches ``run``, when already known."""
    if (existing.run_id != run.pk or run.owner) and not (
        reachable if reachable is not None else run_scope(run).exists()
    ):
        # ``run`` may be a reference built from the client's run id: an unknown (or another
        # tenant's, or another agent's) run is a 404 whatever the key, as it was before the key
        # was looked at — a replay never hands over an action of a run the caller does not reach.
        raise errors.NotFound.for_id("Run", run.pk)
    if existing.run_id != run.pk or existing.payload_hash != payload_hash:
        raise errors.IdempotencyKeyReused(
            "This idempotency key was already used for a different action.",
            details={
                "idempotency_key": existing.idempotency_key,
                "action_id": existing.pk if existing.run_id == run.pk else None,
            },
        )
    return existing
