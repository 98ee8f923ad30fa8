"""The ledger: every state-changing tool call of a run, recorded before it happens (idempotently,
per tenant and idempotency key) and moved through its states as the agent reports on it. One
function per transition, keyword-only and typed; each is a compare-and-set with its audit event
in the same transaction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from ledger import errors
from ledger.audit import Actor, audit_record
from ledger.hashing import sha256_hex
from ledger.ids import new_action_id
from ledger.models import Action, ActionClass, ApprovalMode, CompensationStrategy, Run
from ledger.policies import ResolvedPolicy, TemplateUnfillable, compensation_args_fill, policy_resolve
from ledger.rules import COMPENSATABLE_CLASSES, NOT_A_PIVOT, pivot_order_warning, reason_required
from ledger.services import limits, pauses
from ledger.services.runs import run_assert_accepts_writes, run_lock, run_scope
from ledger.transitions import ACTION_TRANSITIONS, transition


def action_payload_hash(
    *, tool: str, target_type: str, target_id: str, args: Any, compensation: dict[str, Any] | None
) -> str:
    """What makes two recordings "the same action". Intent and snapshots are left out on purpose:
    an agent retrying after a timeout re-reads its target and rephrases its reasoning, and that
    must still count as the same call."""
    return sha256_hex(
        {
            "tool": tool,
            "target_type": target_type,
            "target_id": target_id,
            "args": args,
            "compensation": compensation,
        }
    )


# "Is this tool a registered compensator for the tenant?": the registry has rows here (the policy
# file's compensators) and Python compensators registered in code in the recovery layer, which
# hands the whole question down as this predicate.
CompensatorCheck = Callable[[str], bool]


@dataclass(frozen=True)
class _Compensation:
    strategy: str
    tool: str
    args: Any  # literal args, or the template they are filled from
    template: Any  # the template the step's args are filled from at plan time; None: literal
    warnings: list[dict[str, Any]]


def _mandated_tool(policy: ResolvedPolicy, *, tool: str) -> str:
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
) -> _Compensation:
    """What undoes a newly recorded action. The agent's compensation is a request: where the
    policy names the compensating tool, any other is refused (``CompensationNotAllowed``); a tool
    it names on its own must be a registered compensator (``UnknownCompensator``, when the caller
    can tell). The policy's templates, not the agent's args, build a policy-named tool's args."""
    mandated = _mandated_tool(policy, tool=tool)
    named = str(compensation["tool"]) if compensation else ""
    if named and mandated and named != mandated:
        raise errors.CompensationNotAllowed(
            f"The policy for {tool} ({policy.pattern}) names {mandated} as its compensation; "
            f"{named} is not allowed.",
            details={"tool": named, "allowed": mandated, "policy": policy.pattern},
        )
    if named and not mandated and is_compensator is not None and not is_compensator(named):
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
    is_compensator: CompensatorCheck | None = None,
    lock_timeout_ms: int = 5000,
    start: bool = False,
) -> RecordedAction:
    """Record a planned action, idempotently per (tenant, idempotency key).

    Same key and payload → the existing action (with its result once succeeded); another payload
    → ``IdempotencyKeyReused``. Concurrent duplicates serialise on an advisory lock for the key:
    the first inserts, the rest then see its row; one that waits longer than ``lock_timeout_ms``
    for a stuck first request gets ``IdempotencyKeyInFlight``.

    A new action's compensation is checked against its policy (``_compensation_for``) and, with
    ``is_compensator``, the agent-named tool against the registered compensators; a replay is not
    checked again (it returns what was accepted).

    ``start``: a new action that needs no approval is also started (``action_start``: running,
    attempt 1, audited as ``action.started``) in the same transaction; one that needs approval is
    left planned for its gate. ``start`` is not part of the payload: a replay, with or without
    it, returns the action as it is now and changes nothing.
    """
    args = {} if args is None else args
    payload_hash = action_payload_hash(
        tool=tool, target_type=target_type, target_id=target_id, args=args, compensation=compensation
    )
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                # Three statements, one round trip (the client-side-binding cursor sends them
                # together, in order): the timeout applies to the key's lock wait only.
                cursor.execute(
                    "SET LOCAL lock_timeout = %s;"
                    " SELECT pg_advisory_xact_lock(hashtextextended(%s, 0));"
                    " SET LOCAL lock_timeout TO DEFAULT",
                    [f"{int(lock_timeout_ms)}ms", f"action-key:{run.tenant_id}:{idempotency_key}"],
                )
            existing = (
                Action.objects.filter(tenant_id=run.tenant_id, idempotency_key=idempotency_key)
                .order_by()
                .first()
            )
            if existing is not None:
                return RecordedAction(_replay(existing, run=run, payload_hash=payload_hash), created=False)
            action = _action_insert(
                run=run,
                actor=actor,
                tool=tool,
                idempotency_key=idempotency_key,
                target_type=target_type,
                target_id=target_id,
                args=args,
                intent=intent or {},
                before_snapshot=before_snapshot,
                compensation=compensation,
                is_compensator=is_compensator,
                payload_hash=payload_hash,
            )
            if start and not action.requires_approval:
                action_start(action=action, actor=actor)
            return RecordedAction(action, created=True)
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


def _replay(existing: Action, *, run: Run, payload_hash: str) -> Action:
    if (existing.run_id != run.pk or run.owner) and not run_scope(run).exists():
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


def _action_insert(
    *,
    run: Run,
    actor: Actor,
    tool: str,
    idempotency_key: str,
    target_type: str,
    target_id: str,
    args: Any,
    intent: dict[str, Any],
    before_snapshot: Any,
    compensation: dict[str, Any] | None,
    is_compensator: CompensatorCheck | None,
    payload_hash: str,
) -> Action:
    locked = run_lock(run, policy_stamp=True)
    run_assert_accepts_writes(locked)
    # An operator's pause (kill switch) of this tool or agent: 409 paused, nothing recorded.
    pauses.pause_check_action(run=locked, tool=tool, active=locked.active_pauses)
    base_policy = policy_resolve(tenant=locked.tenant, tool=tool, stamp=locked.policy_stamp)
    # The policy's rules on the args (first match wins; a deny rule → 403, nothing recorded), then
    # its limits, counted under a lock per limit scope (``ledger.services.limits``).
    policy, rule = base_policy.with_args(args)
    owner = actor.key.name if actor.key is not None else locked.owner
    exceeded = limits.limits_check(
        policy=policy, tenant_id=locked.tenant_id, tool=tool, owner=owner, args=args, now=timezone.now()
    )
    if exceeded is not None and not policy.requires_approval:
        policy = replace(policy, approval=ApprovalMode.MANUAL)
    undo = _compensation_for(
        policy,
        tool=tool,
        target_type=target_type,
        target_id=target_id,
        args=args,
        compensation=compensation,
        is_compensator=is_compensator,
    )
    seq = locked.action_count + 1
    action_id = new_action_id()
    warnings = pivot_warnings_for_new(
        run=locked, action_class=policy.action_class, tool=tool, action_id=action_id, seq=seq
    )
    warnings.extend(undo.warnings)
    if (
        undo.strategy == CompensationStrategy.NONE
        and policy.action_class == ActionClass.EXTERNAL_IRREVERSIBLE
    ):
        warnings.append(
            {
                "code": "irreversible_without_correction",
                "message": f"{tool} is irreversible and has no correction registered.",
            }
        )
    action = Action.objects.create(
        id=action_id,
        tenant_id=locked.tenant_id,
        run=locked,
        seq=seq,
        tool=tool,
        target_type=target_type,
        target_id=target_id,
        args=args,
        idempotency_key=idempotency_key,
        owner=owner,
        payload_hash=payload_hash,
        intent=intent,
        before_snapshot=before_snapshot,
        risk=policy.risk,
        action_class=policy.action_class,
        approval_mode=policy.approval,
        requires_approval=policy.requires_approval,
        # As it applied, frozen: ``compensation_args`` is the template this action's compensation
        # args are filled from when an unwind is planned (None: its compensation args are literal).
        # ``risk``/``approval``/``approvers`` as they applied to this call; ``rule``: the rule that
        # set them (null: none matched); ``limit``: the limit it would exceed (null: none).
        policy={
            **policy.as_dict(),
            "compensation_args": undo.template,
            "rule": rule.stamp() if rule is not None else None,
            "limit": exceeded.stamp() if exceeded is not None else None,
        },
        compensation_strategy=undo.strategy,
        compensation_tool=undo.tool,
        compensation_args=undo.args,
        warnings=warnings,
    )
    audit_record(
        tenant=locked.tenant,
        run=locked,
        actor=actor,
        kind="action.recorded",
        subject=action,
        to_state=action.status,
        data={
            "tool": tool,
            "target_id": target_id,
            "risk": policy.risk,
            "idempotency_key": idempotency_key,
            **({"rule": rule.stamp()} if rule is not None else {}),
            **({"limit": exceeded.stamp()} if exceeded is not None else {}),
        },
        # The sequence number moves with the chain head, under the run's row lock.
        run_updates={"action_count": seq},
    )
    return action


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


@transaction.atomic
def action_start(*, action: Action, actor: Actor) -> Action:
    """planned/approved/failed → running, attempts + 1. Gated actions explain why they may not."""
    action.run = run = run_lock(action.run, policy_stamp=True)  # fresh, with its chain head and pauses
    run_assert_accepts_writes(run)
    # A pause of this tool or agent stops the call even though it was recorded before the pause.
    pauses.pause_check_action(
        run=run, tool=action.tool, active=run.active_pauses, outcome="the action was not started"
    )
    current, attempts = Action.objects.filter(pk=action.pk).values_list("status", "attempts").get()
    if current == Action.Status.AWAITING_APPROVAL:
        raise errors.ApprovalPending(
            f"Action {action.pk} is waiting for approval.",
            details={"action_id": action.pk, "current": current},
        )
    if current == Action.Status.REJECTED:
        raise errors.ApprovalRejected(
            f"Action {action.pk} was rejected (or its approval expired).",
            details={"action_id": action.pk, "current": current, "error": action.error},
        )
    if current == Action.Status.PLANNED and action.requires_approval:
        raise errors.ApprovalPending(
            f"Action {action.pk} needs approval before it starts.",
            details={"action_id": action.pk, "current": current},
        )
    attempts += 1
    return _action_transition(
        action,
        to=Action.Status.RUNNING,
        actor=actor,
        kind="action.started",
        updates={"attempts": attempts, "started_at": timezone.now(), "error": "", "error_layer": ""},
        data={"attempt": attempts},
        current=current,
    )


@transaction.atomic
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
    the run's completion order, which LIFO compensation follows."""
    action.run = run = run_lock(action.run)  # fresh, with its audit chain head
    if not reconciled:
        # A background job that finishes after the run was cancelled, closed or handed to an unwind
        # cannot write (API.md); a failed run still takes the late report of an action that was
        # running, and an operator reconciling an unknown outcome always may.
        run_assert_accepts_writes(run, report=True)
    completion_seq = run.completion_count + 1
    allowed = [Action.Status.UNKNOWN] if reconciled else [Action.Status.RUNNING]
    updates: dict[str, Any] = {"completion_seq": completion_seq, "completed_at": timezone.now()}
    if result is not None or not reconciled:
        updates["result"] = result
    if after_snapshot is not None:
        updates["after_snapshot"] = after_snapshot
    _action_transition(
        action,
        to=Action.Status.SUCCEEDED,
        actor=actor,
        kind="action.reconciled" if reconciled else "action.succeeded",
        reason=reason,
        updates=updates,
        allowed_from=allowed,
        data={"completion_seq": completion_seq},
        run_updates={"completion_count": completion_seq},
    )
    return action


@transaction.atomic
def action_fail(
    *, action: Action, actor: Actor, error: str, retryable: bool, layer: str, outcome_unknown: bool = False
) -> Action:
    """running → failed, or → unknown when the call timed out and may have happened."""
    if layer not in Action.ErrorLayer.values:
        raise errors.ValidationFailed(
            f"layer must be one of {', '.join(Action.ErrorLayer.values)}.", details={"layer": layer}
        )
    action.run = run_lock(action.run)  # fresh, with its audit chain head
    # The late report of a running action: a failed run takes it (run_assert_accepts_writes).
    run_assert_accepts_writes(action.run, report=True)
    to = Action.Status.UNKNOWN if outcome_unknown else Action.Status.FAILED
    return _action_transition(
        action,
        to=to,
        actor=actor,
        kind="action.outcome_unknown" if outcome_unknown else "action.failed",
        reason=error,
        updates={
            "error": error,
            "retryable": retryable,
            "error_layer": layer,
            "completed_at": timezone.now(),
        },
        allowed_from=[Action.Status.RUNNING],
        data={"retryable": retryable, "layer": layer},
    )


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
        return action_succeed(
            action=action,
            actor=actor,
            result=result,
            after_snapshot=after_snapshot,
            reconciled=True,
            reason=reason,
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
