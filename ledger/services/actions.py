"""The ledger: every state-changing tool call of a run, recorded before it happens (idempotently,
per tenant and idempotency key) and moved through its states as the agent reports on it. One
function per transition, keyword-only and typed; each is a compare-and-set with its audit event
in the same transaction."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import orjson
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from ledger import errors
from ledger.audit import Actor, audit_record, event_template, slot
from ledger.hashing import canonical_json_bytes
from ledger.ids import new_action_id
from ledger.models import Action, ActionClass, ApprovalMode, CompensationStrategy, Run, Tenant
from ledger.policies import (
    ResolvedPolicy,
    TemplateUnfillable,
    compensation_args_fill,
    policy_resolve,
    policy_stamp_cached,
)
from ledger.policy_rules import RulesApplied
from ledger.rules import COMPENSATABLE_CLASSES, NOT_A_PIVOT, pivot_order_warning, reason_required
from ledger.services import limits, pauses, writes
from ledger.services.limits import LimitExceeded
from ledger.services.runs import run_assert_accepts_writes, run_closed_states, run_lock, run_scope
from ledger.tool_names import check_tool_name
from ledger.transitions import ACTION_TRANSITIONS, transition


def action_payload_hash(
    *,
    tool: str,
    target_type: str,
    target_id: str,
    args: Any,
    compensation: dict[str, Any] | None,
    via: dict[str, str] | None = None,
) -> str:
    """What makes two recordings "the same action". Intent and snapshots are left out on purpose:
    an agent retrying after a timeout re-reads its target and rephrases its reasoning, and that
    must still count as the same call. The upstream that performs it (``via``) is in: the same
    call to another server is another action. Hashed only when sent, so the hash of an action
    recorded without it is what it always was."""
    return _payload_hash(
        tool=tool,
        target_type=target_type,
        target_id=target_id,
        args_json=canonical_json_bytes(args),
        compensation=compensation,
        via=via,
    )


def _payload_hash(
    *,
    tool: str,
    target_type: str,
    target_id: str,
    args_json: bytes,
    compensation: dict[str, Any] | None,
    via: dict[str, str] | None = None,
) -> str:
    """``sha256_hex`` of the payload's canonical JSON, the args given as their canonical bytes:
    the document is spelled around them (its keys in sorted order), so they are encoded once and
    the same bytes go to the database (``_record_payload``)."""
    document = b"".join(
        (
            b'{"args":',
            args_json,
            b',"compensation":',
            canonical_json_bytes(compensation),
            b',"target_id":',
            canonical_json_bytes(target_id),
            b',"target_type":',
            canonical_json_bytes(target_type),
            b',"tool":',
            canonical_json_bytes(tool),
            # ``via`` sorts last; left out when not sent (the hash of an action without it is
            # what it always was).
            *((b',"via":', canonical_json_bytes(via)) if via is not None else ()),
            b"}",
        )
    )
    return hashlib.sha256(document).hexdigest()


# "Is this tool a registered compensator for the tenant?": the registry has rows here (the policy
# file's compensators) and Python compensators registered in code in the recovery layer, which
# hands the whole question down as this predicate.
# Called with the tool and the policy stamp the record relies on: a registry the caller keeps per
# process may answer from its copy read under that stamp (the database checks the stamp).
CompensatorCheck = Callable[[str, int | None], bool]


@dataclass(frozen=True)
class _Compensation:
    strategy: str
    tool: str
    args: Any  # literal args, or the template they are filled from
    template: Any  # the template the step's args are filled from at plan time; None: literal
    warnings: list[dict[str, Any]]


def mandated_compensation_tool(policy: ResolvedPolicy, *, tool: str) -> str:
    """The compensating tool the forward tool's policy names ("" when it leaves it to the agent)."""
    if policy.action_class == ActionClass.READ_ONLY:
        return ""
    if policy.compensation == CompensationStrategy.SNAPSHOT:
        return policy.compensation_tool or f"{tool}.restore"
    if policy.compensation_tool and policy.compensation != CompensationStrategy.NONE:
        return policy.compensation_tool
    return ""


def _agent_strategy(policy: ResolvedPolicy) -> str:
    """A compensation the agent chose: a correction for an irreversible tool, else a custom undo."""
    if policy.action_class == ActionClass.EXTERNAL_IRREVERSIBLE:
        return CompensationStrategy.CORRECTION
    return CompensationStrategy.CUSTOM


def _compensation_for(
    policy: ResolvedPolicy,
    *,
    tool: str,
    target_type: str,
    target_id: str,
    args: Any,
    compensation: dict[str, Any] | None,
    is_compensator: CompensatorCheck | None,
    stamp: int | None = None,
) -> _Compensation:
    """What undoes a newly recorded action. The agent's compensation is a request: where the
    policy names the compensating tool, any other is refused (``CompensationNotAllowed``); a tool
    it names on its own must be a registered compensator (``UnknownCompensator``, when the caller
    can tell). The policy's templates, not the agent's args, build a policy-named tool's args."""
    mandated = mandated_compensation_tool(policy, tool=tool)
    named = str(compensation["tool"]) if compensation else ""
    if named and mandated and named != mandated:
        raise errors.CompensationNotAllowed(
            f"The policy for {tool} ({policy.pattern}) names {mandated} as its compensation; "
            f"{named} is not allowed.",
            details={"tool": named, "allowed": mandated, "policy": policy.pattern},
        )
    if named and not mandated and is_compensator is not None and not is_compensator(named, stamp):
        raise errors.UnknownCompensator(
            f"{named} is not a registered compensator; an action can only be undone by a tool "
            "registered in the policy file (or in code).",
            details={"tool": named},
        )
    if policy.action_class == ActionClass.READ_ONLY:
        return _Compensation(CompensationStrategy.NONE, "", None, None, [])
    if policy.compensation == CompensationStrategy.SNAPSHOT:
        return _Compensation(CompensationStrategy.SNAPSHOT, mandated, None, None, [])
    warnings: list[dict[str, Any]] = []
    if named and not (mandated and policy.compensation_args is not None):
        # The agent's own args: for a tool it chose (a registered compensator, which its own
        # policy governs when the step runs), or for the policy's tool when the policy does not
        # say how to build them.
        return _Compensation(
            policy.compensation if mandated else _agent_strategy(policy),
            named,
            (compensation or {}).get("args", {}),
            None,
            [],
        )
    if not mandated:
        return _Compensation(CompensationStrategy.NONE, "", None, None, [])
    # The policy's compensation: its templates, or the forward args as they are ("$args"), filled
    # when the unwind is planned, from the args as they are then (an approver's edit included).
    template = policy.compensation_args if policy.compensation_args is not None else "$args"
    filled: Any = None
    try:
        filled = compensation_args_fill(template, args=args, target_id=target_id, target_type=target_type)
    except TemplateUnfillable as exc:
        warnings.append(
            {
                "code": "compensation_args_unfillable",
                "message": f"The compensation args of {mandated} cannot be filled from this action "
                f"({exc}); undoing it will fail unless an approver's edit supplies it.",
                "path": exc.path,
            }
        )
    sent = (compensation or {}).get("args")
    if named and sent and sent != filled:
        warnings.append(
            {
                "code": "compensation_args_from_policy",
                "message": f"The policy builds {mandated}'s args from this action; the args sent with "
                "the compensation are not used.",
            }
        )
    return _Compensation(policy.compensation, mandated, template, template, warnings)


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

    A new action's compensation is checked against its policy (``_compensation_for``) and, with
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
    payload_hash = _payload_hash(
        tool=tool,
        target_type=target_type,
        target_id=target_id,
        args_json=args_json,
        compensation=compensation,
        via=via,
    )
    call = _Call(
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
        recorded = _record_at_once(call, is_compensator=is_compensator, on_gated=on_gated)
        if recorded is None:
            with transaction.atomic():
                recorded = _record_checked(call, is_compensator=is_compensator, on_gated=on_gated)
        return recorded
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available
            raise errors.IdempotencyKeyInFlight(
                "An action with this idempotency key is still being recorded; retry shortly.",
                details={"idempotency_key": idempotency_key},
            ) from exc
        raise
    except IntegrityError:
        # Only reachable if a writer bypassed the advisory lock; the row exists now.
        existing = (
            Action.objects.filter(tenant_id=run.tenant_id, idempotency_key=idempotency_key).order_by().first()
        )
        if existing is None:
            raise
        return RecordedAction(_replay(existing, run=run, payload_hash=payload_hash), created=False)


@dataclass(frozen=True)
class _Call:
    """One recording request, as the agent sent it."""

    run: Run
    actor: Actor
    tool: str
    idempotency_key: str
    target_type: str
    target_id: str
    args: Any
    args_json: bytes  # ``args`` as canonical JSON (ledger.hashing.canonical_json_bytes)
    intent: dict[str, Any]
    before_snapshot: Any
    compensation: dict[str, Any] | None
    via: dict[str, str] | None
    payload_hash: str
    start: bool
    lock_timeout_ms: int


def _tenant_of(run: Run) -> Tenant:
    # A reference to the tenant is all the policies need (its id); loading it would cost a query.
    return run.tenant if Run.tenant.is_cached(run) else Tenant(pk=run.tenant_id)


def key_lock_name(tenant_id: int, idempotency_key: str) -> str:
    """The advisory lock an idempotency key's writers serialise on. ``saga_action_record`` builds
    the same name in SQL (``ledger/0013``); a test holds this one and sees the function wait."""
    return f"action-key:{tenant_id}:{idempotency_key}"


def _recording_agent(call: _Call, run: Run) -> str:
    """Who the action is counted against (``Action.owner``, limits ``per: agent``): the
    authenticated key's name, else the run's agent."""
    return call.actor.key.name if call.actor.key is not None else run.owner


def _record_at_once(
    call: _Call, *, is_compensator: CompensatorCheck | None, on_gated: Gate | None
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
    action, events = _new_action(call, policy=policy, rule=rule, exceeded=None, undo=undo, owner=owner)
    answer = writes.call(
        "saga_action_record",
        {
            **_record_payload(call, action, events),
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
        raise errors.NotFound(f"Run {call.run.pk} not found.", details={"id": call.run.pk})
    if outcome == "closed":
        run_assert_accepts_writes(Run(pk=call.run.pk, status=answer["current"]))
    if outcome != "created":
        raise RuntimeError(f"saga_action_record answered {outcome!r}")
    action.seq = answer["seq"]
    return RecordedAction(action, created=True)


def _record_checked(
    call: _Call, *, is_compensator: CompensatorCheck | None, on_gated: Gate | None
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
    action, events = _new_action(call, policy=policy, rule=rule, exceeded=exceeded, undo=undo, owner=owner)
    action.warnings[:0] = pivot_warnings_for_new(
        run=locked,
        action_class=policy.action_class,
        tool=call.tool,
        action_id=action.pk,
        seq=locked.action_count + 1,
    )
    answer = writes.call("saga_action_record", {**_record_payload(call, action, events), "checked": True})
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
    policy: ResolvedPolicy, call: _Call, *, is_compensator: CompensatorCheck | None, stamp: int | None
) -> _Compensation:
    return _compensation_for(
        policy,
        tool=call.tool,
        target_type=call.target_type,
        target_id=call.target_id,
        args=call.args,
        compensation=call.compensation,
        is_compensator=is_compensator,
        stamp=stamp,
    )


def _new_action(
    call: _Call,
    *,
    policy: ResolvedPolicy,
    rule: RulesApplied | None,
    exceeded: LimitExceeded | None,
    undo: _Compensation,
    owner: str,
) -> tuple[Action, list[dict[str, Any]]]:
    """The action row to insert (its ``seq`` is the database's) and its audit events: recorded,
    and started when ``call.start`` and it needs no approval."""
    warnings = list(undo.warnings)
    if (
        undo.strategy == CompensationStrategy.NONE
        and policy.action_class == ActionClass.EXTERNAL_IRREVERSIBLE
    ):
        warnings.append(
            {
                "code": "irreversible_without_correction",
                "message": f"{call.tool} is irreversible and has no correction registered.",
            }
        )
    now = timezone.now()
    starts = call.start and not policy.requires_approval
    action = Action(
        id=new_action_id(),
        tenant_id=call.run.tenant_id,
        run=call.run,
        tool=call.tool,
        target_type=call.target_type,
        target_id=call.target_id,
        args=call.args,
        idempotency_key=call.idempotency_key,
        owner=owner,
        payload_hash=call.payload_hash,
        intent=call.intent,
        before_snapshot=call.before_snapshot,
        risk=policy.risk,
        action_class=policy.action_class,
        approval_mode=policy.approval,
        requires_approval=policy.requires_approval,
        # As it applied, frozen: ``compensation_args`` is the template this action's compensation
        # args are filled from when an unwind is planned (None: its compensation args are literal).
        # ``risk``/``approval``/``approvers`` as they applied to this call; ``rule``: the rule that
        # set them (null: none applied; ``also``: further rules that applied because a value's kind
        # left them undecided); ``limit``: the limit it would exceed (null: none).
        policy={
            **policy.as_dict(),
            "compensation_args": undo.template,
            "rule": rule.stamp() if rule is not None else None,
            "limit": exceeded.stamp() if exceeded is not None else None,
        },
        compensation_strategy=undo.strategy,
        compensation_tool=undo.tool,
        compensation_args=undo.args,
        via=call.via,
        warnings=warnings,
        status=Action.Status.RUNNING if starts else Action.Status.PLANNED,
        attempts=1 if starts else 0,
        started_at=now if starts else None,
        created_at=now,
        updated_at=now,
    )
    action._state.adding = False

    def event(**fields: Any) -> dict[str, Any]:
        return event_template(
            tenant_id=call.run.tenant_id,
            run_id=call.run.pk,
            actor=call.actor,
            subject_type="action",
            subject_id=action.pk,
            created_at=now,
            **fields,
        )

    events = [
        event(
            kind="action.recorded",
            to_state=Action.Status.PLANNED,
            data={
                "tool": call.tool,
                "target_id": call.target_id,
                "risk": policy.risk,
                "idempotency_key": call.idempotency_key,
                **({"via": call.via} if call.via is not None else {}),
                **({"rule": rule.stamp()} if rule is not None else {}),
                **({"limit": exceeded.stamp()} if exceeded is not None else {}),
            },
        )
    ]
    if starts:
        events.append(
            event(
                kind="action.started",
                from_state=Action.Status.PLANNED,
                to_state=Action.Status.RUNNING,
                data={"attempt": 1},
            )
        )
    return action, events


_ROW_FIELDS = [
    field for field in Action._meta.concrete_fields if field.attname not in ("seq", "run_id", "tenant_id")
]


def _record_payload(call: _Call, action: Action, events: list[dict[str, Any]]) -> dict[str, Any]:
    row = {}
    for column in _ROW_FIELDS:
        value = getattr(action, column.attname)
        row[column.column] = value.isoformat() if isinstance(value, datetime) else value
    # The args as already encoded for the payload hash, written into the call's JSON verbatim.
    row[Action._meta.get_field("args").column] = orjson.Fragment(call.args_json)
    return {
        "tenant_id": call.run.tenant_id,
        "run_id": call.run.pk,
        "run_owner": call.run.owner or "",
        "lock_timeout_ms": int(call.lock_timeout_ms),
        "closed": list(run_closed_states()),
        "action": row,
        "events": events,
    }


def _replay(existing: Action, *, run: Run, payload_hash: str, reachable: bool | None = None) -> Action:
    """The action a key was first used for, when the caller may have it. ``reachable``: whether
    the caller reaches ``run``, when already known."""
    if (existing.run_id != run.pk or run.owner) and not (
        reachable if reachable is not None else run_scope(run).exists()
    ):
        # ``run`` may be a reference built from the client's run id: an unknown (or another
        # tenant's, or another agent's) run is a 404 whatever the key, as it was before the key
        # was looked at — a replay never hands over an action of a run the caller does not reach.
        raise errors.NotFound(f"Run {run.pk} not found.", details={"id": run.pk})
    if existing.run_id != run.pk or existing.payload_hash != payload_hash:
        raise errors.IdempotencyKeyReused(
            "This idempotency key was already used for a different action.",
            details={
                "idempotency_key": existing.idempotency_key,
                "action_id": existing.pk if existing.run_id == run.pk else None,
            },
        )
    return existing


def _fill(action: Action, row: Action) -> None:
    """``action`` (maybe a reference) as ``row``, read under the write's locks."""
    for name in _ALL_FIELDS:
        setattr(action, name, getattr(row, name))
    action._state.adding = False
    # The run the instance may carry was read before this write moved its chain head and
    # counters: the next access reads it again.
    action._state.fields_cache.pop("run", None)


_ALL_FIELDS = [f.attname for f in Action._meta.concrete_fields]


def _action_transition(action: Action, **fields: Any) -> Action:
    """``ledger.transitions.transition`` on the action table, on its run's audit chain."""
    return transition(action, table=ACTION_TRANSITIONS, run=action.run, **fields)


@transaction.atomic
def action_await_approval(*, action: Action, actor: Actor) -> Action:
    return _action_transition(
        action,
        to=Action.Status.AWAITING_APPROVAL,
        actor=actor,
        kind="action.awaiting_approval",
        allowed_from=[Action.Status.PLANNED],
    )


@transaction.atomic
def action_await_approval_again(*, action: Action, actor: Actor, reason: str) -> Action:
    """rejected → awaiting_approval: its approval expired or was rejected and is asked again. Only
    while the run still takes writes (the agent is waiting for it); the caller opens the approval."""
    action.run = run = run_lock(action.run)  # fresh, with its audit chain head
    run_assert_accepts_writes(run)
    return _action_transition(
        action,
        to=Action.Status.AWAITING_APPROVAL,
        actor=actor,
        kind="action.awaiting_approval",
        reason=reason,
        updates={"error": ""},
        allowed_from=[Action.Status.REJECTED],
        data={"asked_again": True},
    )


@transaction.atomic
def action_approve(*, action: Action, actor: Actor, reason: str, args: Any = None) -> Action:
    """awaiting_approval → approved; ``args`` replaces the action's args when the approver edited
    them (the approval service has already audited both versions)."""
    updates: dict[str, Any] = {}
    if args is not None:
        updates["args"] = args
    return _action_transition(
        action,
        to=Action.Status.APPROVED,
        actor=actor,
        kind="action.approved",
        reason=reason,
        updates=updates,
    )


@transaction.atomic
def action_reject(*, action: Action, actor: Actor, reason: str) -> Action:
    return _action_transition(
        action,
        to=Action.Status.REJECTED,
        actor=actor,
        kind="action.rejected",
        reason=reason,
        updates={"error": reason},
    )


def action_start(*, action: Action, actor: Actor) -> Action:
    """planned/approved/failed → running, attempts + 1. Gated actions explain why they may not.

    One call of ``saga_action_move``; with a pause active in the tenant, the pause is checked in
    Python under the run's lock first (a pause of this tool or agent stops the call even though it
    was recorded before the pause). ``action`` may be a reference (``Action(pk, tenant, owner)``,
    ``ledger.selectors.action_reference_for_write``): it is filled in from the row."""
    move = _Move(
        to=Action.Status.RUNNING,
        kind="action.started",
        allowed=[Action.Status.APPROVED, Action.Status.FAILED],
        allowed_unless_approval=[Action.Status.PLANNED],
        report=False,
        counter="attempts",
        set={"started_at": timezone.now(), "error": "", "error_layer": ""},
        data={"attempt": slot("attempt")},
        pause_check=True,
    )
    return _action_move(action, actor=actor, move=move, refused=_start_refusal)


def _start_refusal(action: Action, current: str) -> errors.SagaError:
    if current == Action.Status.AWAITING_APPROVAL:
        return errors.ApprovalPending(
            f"Action {action.pk} is waiting for approval.",
            details={"action_id": action.pk, "current": current},
        )
    if current == Action.Status.REJECTED:
        return errors.ApprovalRejected(
            f"Action {action.pk} was rejected (or its approval expired).",
            details={"action_id": action.pk, "current": current, "error": action.error},
        )
    if current == Action.Status.PLANNED and action.requires_approval:
        return errors.ApprovalPending(
            f"Action {action.pk} needs approval before it starts.",
            details={"action_id": action.pk, "current": current},
        )
    return errors.InvalidTransition(action, to=Action.Status.RUNNING, current=current)


@dataclass(frozen=True)
class _Move:
    """An agent's report on its action, for ``saga_action_move``."""

    to: str
    kind: str
    allowed: list[str]
    report: bool  # the agent reporting how a running action ended (run_closed_states)
    set: dict[str, Any]
    data: dict[str, Any]
    allowed_unless_approval: list[str] = field(default_factory=list)
    counter: str | None = None
    reason: str = ""
    pause_check: bool = False


def _action_move(
    action: Action,
    *,
    actor: Actor,
    move: _Move,
    refused: Callable[[Action, str], errors.SagaError] | None = None,
) -> Action:
    payload = {
        "tenant_id": action.tenant_id,
        "run_owner": action.owner or "",
        "action_id": action.pk,
        "to": move.to,
        "allowed": move.allowed,
        "allowed_unless_approval": move.allowed_unless_approval,
        "closed": list(run_closed_states(report=move.report)),
        "counter": move.counter,
        "set": {
            name: value.isoformat() if isinstance(value, datetime) else value
            for name, value in {**move.set, "updated_at": timezone.now()}.items()
        },
        "pause_check": move.pause_check,
        "event": event_template(
            tenant_id=action.tenant_id,
            run_id=None,  # the action's, as the database reads it
            actor=actor,
            kind=move.kind,
            subject_type="action",
            subject_id=action.pk,
            from_state=slot("from"),
            to_state=move.to,
            reason=move.reason,
            data=move.data,
        ),
    }
    answer = writes.call("saga_action_move", payload)
    if answer["outcome"] == "checks":
        # A pause is active in the tenant: its patterns are Python's. Checked under the run's lock,
        # then the same call in the same transaction.
        with transaction.atomic():
            current = writes.action_from_row(answer["action"])
            run = run_lock(Run(pk=current.run_id, tenant_id=current.tenant_id), policy_stamp=True)
            pauses.pause_check_action(
                run=run, tool=current.tool, active=run.active_pauses, outcome="the action was not started"
            )
            answer = writes.call("saga_action_move", {**payload, "pause_check": False})
    outcome = answer["outcome"]
    if outcome == "not_found":
        raise errors.NotFound(f"Action {action.pk} not found.", details={"id": action.pk})
    row = writes.action_from_row(answer["action"])
    _fill(action, row)
    if outcome == "closed":
        run_assert_accepts_writes(Run(pk=row.run_id, status=answer["current"]), report=move.report)
    if outcome == "refused":
        current = answer["current"]
        raise (
            refused(action, current)
            if refused
            else errors.InvalidTransition(action, to=move.to, current=current)
        )
    if outcome != "moved":
        raise RuntimeError(f"saga_action_move answered {outcome!r}")
    return action


def action_succeed(
    *,
    action: Action,
    actor: Actor,
    result: Any = None,
    after_snapshot: Any = None,
    reconciled: bool = False,
    reason: str = "",
) -> Action:
    """running → succeeded (or unknown → succeeded when ``reconciled``); takes the next place in
    the run's completion order, which LIFO compensation follows.

    The agent's report is one call of ``saga_action_move``. A background job that finishes after
    the run was cancelled, closed or handed to an unwind cannot write (API.md); a failed run still
    takes the late report of an action that was running, and an operator reconciling an unknown
    outcome always may."""
    if reconciled:
        return _action_reconciled(
            action=action, actor=actor, result=result, after_snapshot=after_snapshot, reason=reason
        )
    updates: dict[str, Any] = {"completed_at": timezone.now(), "result": result}
    if after_snapshot is not None:
        updates["after_snapshot"] = after_snapshot
    move = _Move(
        to=Action.Status.SUCCEEDED,
        kind="action.succeeded",
        allowed=[Action.Status.RUNNING],
        report=True,
        counter="completion_seq",
        set=updates,
        data={"completion_seq": slot("completion_seq")},
        reason=reason,
    )
    return _action_move(action, actor=actor, move=move)


@transaction.atomic
def _action_reconciled(
    *, action: Action, actor: Actor, result: Any, after_snapshot: Any, reason: str
) -> Action:
    """unknown → succeeded: someone checked the target and it happened."""
    action.run = run = run_lock(action.run)  # fresh, with its audit chain head
    completion_seq = run.completion_count + 1
    updates: dict[str, Any] = {"completion_seq": completion_seq, "completed_at": timezone.now()}
    if result is not None:
        updates["result"] = result
    if after_snapshot is not None:
        updates["after_snapshot"] = after_snapshot
    _action_transition(
        action,
        to=Action.Status.SUCCEEDED,
        actor=actor,
        kind="action.reconciled",
        reason=reason,
        updates=updates,
        allowed_from=[Action.Status.UNKNOWN],
        data={"completion_seq": completion_seq},
        run_updates={"completion_count": completion_seq},
    )
    return action


def action_fail(
    *, action: Action, actor: Actor, error: str, retryable: bool, layer: str, outcome_unknown: bool = False
) -> Action:
    """running → failed, or → unknown when the call timed out and may have happened. One call of
    ``saga_action_move``; the late report of a running action: a failed run takes it
    (``run_assert_accepts_writes``)."""
    if layer not in Action.ErrorLayer.values:
        raise errors.ValidationFailed(
            f"layer must be one of {', '.join(Action.ErrorLayer.values)}.", details={"layer": layer}
        )
    move = _Move(
        to=Action.Status.UNKNOWN if outcome_unknown else Action.Status.FAILED,
        kind="action.outcome_unknown" if outcome_unknown else "action.failed",
        allowed=[Action.Status.RUNNING],
        report=True,
        set={"error": error, "retryable": retryable, "error_layer": layer, "completed_at": timezone.now()},
        data={"retryable": retryable, "layer": layer},
        reason=error,
    )
    return _action_move(action, actor=actor, move=move)


@transaction.atomic
def action_reconcile(
    *,
    action: Action,
    actor: Actor,
    happened: bool,
    reason: str,
    result: Any = None,
    after_snapshot: Any = None,
) -> Action:
    """unknown → succeeded (it did happen) or failed (it did not): someone checked the target."""
    reason = reason_required(reason)
    if happened:
        return _action_reconciled(
            action=action, actor=actor, result=result, after_snapshot=after_snapshot, reason=reason
        )
    return _action_transition(
        action,
        to=Action.Status.FAILED,
        actor=actor,
        kind="action.reconciled",
        reason=reason,
        allowed_from=[Action.Status.UNKNOWN],
        updates={"error": f"reconciled: did not happen ({reason})", "retryable": True},
    )


@transaction.atomic
def action_verify(
    *, action: Action, actor: Actor, ok: bool, expected: Any = None, actual: Any = None, reason: str = ""
) -> Action:
    """Record the agent's check of an action's effect. Not a status change; a mismatch is turned
    into a recovery item by the recovery service that calls this."""
    # The row's status, locked, not the caller's copy: a stale object must not verify an action
    # that has since been compensated.
    current = Action.objects.select_for_update().filter(pk=action.pk).values_list("status", flat=True).first()
    if current is None:
        raise errors.NotFound(f"Action {action.pk} does not exist.")
    if current not in (Action.Status.SUCCEEDED, Action.Status.UNKNOWN, Action.Status.RUNNING):
        raise errors.InvalidTransition(
            action,
            to="verified",
            current=current,
            message=f"Action {action.pk} is {current}; only a completed action can be verified.",
        )
    verification = {
        "ok": ok,
        "expected": expected,
        "actual": actual,
        "reason": reason,
        "at": timezone.now().isoformat(),
    }
    Action.objects.filter(pk=action.pk).update(
        verified=ok, verification=verification, updated_at=timezone.now()
    )
    action.verified, action.verification = ok, verification
    audit_record(
        tenant=action.run.tenant,
        run=action.run,
        actor=actor,
        kind="action.verified" if ok else "action.verification_failed",
        subject=action,
        reason=reason,
        data={"expected": expected, "actual": actual},
    )
    return action


@transaction.atomic
def action_compensation_started(*, action: Action, actor: Actor, step_id: str) -> Action:
    return _action_transition(
        action,
        to=Action.Status.COMPENSATING,
        actor=actor,
        kind="action.compensating",
        data={"step_id": step_id},
    )


@transaction.atomic
def action_compensation_finished(
    *, action: Action, actor: Actor, outcome: str, step_id: str, reason: str = "", state: Any = None
) -> Action:
    """compensating → compensated | compensation_failed, or back to succeeded when the step was
    skipped (the forward effect stands)."""
    targets = {
        "done": Action.Status.COMPENSATED,
        "failed": Action.Status.COMPENSATION_FAILED,
        "drifted": Action.Status.COMPENSATION_FAILED,
        "skipped": Action.Status.SUCCEEDED,
    }
    if outcome not in targets:
        raise errors.ValidationFailed(
            f"outcome must be one of {', '.join(targets)}.", details={"outcome": outcome}
        )
    # Only from compensating: "succeeded" is also reachable from running and unknown, and a
    # skipped step must not complete an action that never finished its forward call.
    return _action_transition(
        action,
        to=targets[outcome],
        actor=actor,
        kind=f"action.compensation_{outcome}",
        reason=reason,
        data={"step_id": step_id, "state": state},
        allowed_from=[Action.Status.COMPENSATING],
    )
