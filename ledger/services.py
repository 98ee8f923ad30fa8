"""Every state change of the record. One function per transition, keyword-only and typed.

Each checks the current state in the database (compare-and-set on the status column, or a row
lock where a counter must move with it), writes its audit event in the same transaction and
raises ``InvalidTransition`` (409) when the state machine does not allow the change.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Model
from django.utils import timezone

from ledger import errors
from ledger.audit import Actor, audit_record
from ledger.hashing import sha256_hex
from ledger.models import (
    Action,
    ActionClass,
    AgentKey,
    Checkpoint,
    CompensationStrategy,
    Membership,
    Run,
    Tenant,
)
from ledger.policies import ResolvedPolicy, policy_resolve, policy_stamp_subquery

# --- State machines --------------------------------------------------------------------------

RUN_TRANSITIONS: dict[str, set[str]] = {
    Run.Status.RUNNING: {Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED},
    # A verification that fails after the agent reported success reopens the run.
    Run.Status.SUCCEEDED: {Run.Status.FAILED},
    Run.Status.FAILED: {Run.Status.COMPENSATING, Run.Status.RUNNING, Run.Status.CLOSED},
    Run.Status.CANCELLED: {Run.Status.COMPENSATING, Run.Status.CLOSED},
    Run.Status.COMPENSATING: {Run.Status.COMPENSATED, Run.Status.FAILED},
    Run.Status.COMPENSATED: set(),
    Run.Status.CLOSED: set(),
}

ACTION_TRANSITIONS: dict[str, set[str]] = {
    Action.Status.PLANNED: {Action.Status.AWAITING_APPROVAL, Action.Status.RUNNING},
    Action.Status.AWAITING_APPROVAL: {Action.Status.APPROVED, Action.Status.REJECTED},
    Action.Status.APPROVED: {Action.Status.RUNNING},
    Action.Status.REJECTED: set(),
    Action.Status.RUNNING: {Action.Status.SUCCEEDED, Action.Status.FAILED, Action.Status.UNKNOWN},
    Action.Status.UNKNOWN: {Action.Status.SUCCEEDED, Action.Status.FAILED},
    Action.Status.FAILED: {Action.Status.RUNNING},
    Action.Status.SUCCEEDED: {Action.Status.COMPENSATING},
    Action.Status.COMPENSATING: {
        Action.Status.COMPENSATED,
        Action.Status.COMPENSATION_FAILED,
        Action.Status.SUCCEEDED,
    },
    Action.Status.COMPENSATION_FAILED: {Action.Status.COMPENSATING},
    Action.Status.COMPENSATED: set(),
}

COMPENSATABLE_CLASSES = {ActionClass.DRAFT_ONLY, ActionClass.INTERNAL_UPDATE, ActionClass.EXTERNAL_REVERSIBLE}


def _sources_for(table: dict[str, set[str]], to: str) -> list[str]:
    return [state for state, targets in table.items() if to in targets]


def _current_status(model: type[Model], pk: Any) -> str:
    # order_by(): no model ordering (Action's joins ledger_run) on a primary-key read.
    current = model.objects.filter(pk=pk).order_by().values_list("status", flat=True).first()
    if current is None:
        raise errors.NotFound(f"{model.__name__} {pk} does not exist.")
    return current


def _compare_and_set(
    obj: Model,
    *,
    table: dict[str, set[str]],
    to: str,
    allowed_from: Iterable[str] | None = None,
    updates: dict[str, Any] | None = None,
    current: str | None = None,
) -> str:
    """Move ``obj.status`` to ``to`` if the row's current status allows it; return the old status.

    The UPDATE's WHERE clause is the check: a concurrent transition that got there first makes
    this one update nothing, and it loses cleanly with the state it lost to. ``current``: the
    status the caller has just read in this transaction (saves reading it again; the WHERE clause
    still decides).
    """
    sources = list(allowed_from) if allowed_from is not None else _sources_for(table, to)
    model = type(obj)
    if current is None and len(sources) == 1:
        # One state it may come from: assume it and let the UPDATE check it (the status is read
        # only when the UPDATE misses, for the error), which saves a statement per transition.
        current = sources[0]
    if current is None:
        current = _current_status(model, obj.pk)
    if current not in sources:
        raise errors.InvalidTransition(obj, to=to, current=current)
    fields = {"status": to, "updated_at": timezone.now(), **(updates or {})}
    if model.objects.filter(pk=obj.pk, status=current).update(**fields) != 1:
        raise errors.InvalidTransition(obj, to=to, current=_current_status(model, obj.pk))
    for name, value in fields.items():
        setattr(obj, name, value)
    return current


# --- Tenants and keys ------------------------------------------------------------------------

KEY_PREFIX = "sk"


@transaction.atomic
def tenant_get_or_create(*, slug: str, name: str = "") -> Tenant:
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    return tenant


@dataclass(frozen=True)
class IssuedKey:
    key: AgentKey
    secret: str  # the full key; shown once, never stored


def _split_key(raw: str) -> tuple[str, str] | None:
    parts = raw.split("_")
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return f"{parts[0]}_{parts[1]}", parts[2]


@transaction.atomic
def agent_key_create(
    *, tenant: Tenant, name: str, scopes: Iterable[str] = ("agent",), actor: Actor
) -> IssuedKey:
    scope_list = sorted(set(scopes))
    unknown = set(scope_list) - set(AgentKey.Scope.values)
    if not scope_list or unknown:
        raise errors.ValidationFailed(
            f"Scopes must be a non-empty subset of {', '.join(AgentKey.Scope.values)}.",
            details={"scopes": sorted(unknown)},
        )
    prefix = f"{KEY_PREFIX}_{secrets.token_hex(6)}"
    secret_part = secrets.token_urlsafe(32).replace("_", "-")
    key = AgentKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, key_hash=sha256_hex(secret_part), scopes=scope_list
    )
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="agent_key.created",
        subject=key,
        data={"name": name, "scopes": scope_list},
    )
    return IssuedKey(key=key, secret=f"{prefix}_{secret_part}")


def agent_key_authenticate(*, raw_key: str) -> AgentKey | None:
    """The active key for a presented secret, or None. Constant-time on the secret part."""
    import hmac

    split = _split_key(raw_key.strip())
    if split is None:
        return None
    prefix, secret_part = split
    key = AgentKey.objects.select_related("tenant").filter(prefix=prefix).first()
    # Compare even when no key matched, so timing does not tell valid prefixes apart.
    stored = key.key_hash if key else "0" * 64
    if not hmac.compare_digest(stored, sha256_hex(secret_part)) or key is None or key.revoked_at is not None:
        return None
    now = timezone.now()
    # last_used_at is advisory: refresh at most once a minute so hot keys don't write per call.
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > 60:
        AgentKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


@transaction.atomic
def agent_key_revoke(*, key: AgentKey, actor: Actor) -> AgentKey:
    if AgentKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()) != 1:
        raise errors.InvalidTransition(key, to="revoked", current="revoked")
    key.refresh_from_db()
    audit_record(tenant=key.tenant, actor=actor, kind="agent_key.revoked", subject=key)
    return key


# --- Runs ------------------------------------------------------------------------------------


def _lock_run(run: Run, *, policy_stamp: bool = False) -> Run:
    """The run's row, locked for this transaction and read fresh. Scoped to ``run.tenant_id``, so
    a reference built from a client's run id (``Run(pk=…, tenant=…)``) finds only its tenant's
    run. The tenant is taken over from ``run`` when it is loaded (it cannot change), not re-read.
    ``policy_stamp``: also read the tool-policy stamp in the same statement (``.policy_stamp``)."""
    runs = Run.objects.select_for_update(of=("self",)).filter(pk=run.pk, tenant_id=run.tenant_id)
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


def _run_transition(
    *,
    run: Run,
    to: str,
    actor: Actor,
    kind: str,
    reason: str = "",
    updates: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    allowed_from: Iterable[str] | None = None,
) -> Run:
    previous = _compare_and_set(run, table=RUN_TRANSITIONS, to=to, updates=updates, allowed_from=allowed_from)
    audit_record(
        tenant=run.tenant,
        run=run,
        actor=actor,
        kind=kind,
        subject=run,
        from_state=previous,
        to_state=to,
        reason=reason,
        data=data,
    )
    return run


@transaction.atomic
def run_complete(*, run: Run, actor: Actor, summary: str = "") -> Run:
    return _run_transition(
        run=run,
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
        run=run,
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
        run=run,
        to=Run.Status.CANCELLED,
        actor=actor,
        kind="run.cancelled",
        reason=reason,
        updates={"finished_at": timezone.now()},
    )


@transaction.atomic
def run_compensation_started(*, run: Run, actor: Actor, reason: str) -> Run:
    return _run_transition(
        run=run, to=Run.Status.COMPENSATING, actor=actor, kind="run.compensating", reason=reason
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
        run=run,
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
        run=run,
        to=Run.Status.RUNNING,
        actor=actor,
        kind="run.resumed",
        reason=reason,
        updates={"finished_at": None, "last_heartbeat_at": now},
    )


@transaction.atomic
def run_close(*, run: Run, actor: Actor, reason: str) -> Run:
    if not reason.strip():
        raise errors.ValidationFailed("A reason is required to close a run.", details={"reason": "required"})
    return _run_transition(
        run=run,
        to=Run.Status.CLOSED,
        actor=actor,
        kind="run.closed",
        reason=reason,
        updates={"finished_at": timezone.now()},
    )


# --- Actions (the ledger) --------------------------------------------------------------------


def _assert_accepts_actions(run: Run) -> None:
    if not run.accepts_actions:
        raise errors.RunNotAcceptingActions(
            f"Run {run.pk} is {run.status}; it accepts no more actions.",
            details={"run_id": run.pk, "current": run.status},
        )


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


def _compensation_for(
    policy: ResolvedPolicy, *, tool: str, args: Any, compensation: dict[str, Any] | None
) -> tuple[str, str, Any]:
    """(strategy, compensating tool, its args) for a newly recorded action."""
    if policy.action_class == ActionClass.READ_ONLY:
        return CompensationStrategy.NONE, "", None
    if policy.compensation == CompensationStrategy.SNAPSHOT:
        return CompensationStrategy.SNAPSHOT, policy.compensation_tool or f"{tool}.restore", None
    if compensation:
        strategy = (
            CompensationStrategy.CORRECTION
            if policy.action_class == ActionClass.EXTERNAL_IRREVERSIBLE
            else CompensationStrategy.CUSTOM
        )
        return strategy, compensation["tool"], compensation.get("args", {})
    if policy.compensation_tool and policy.compensation != CompensationStrategy.NONE:
        return policy.compensation, policy.compensation_tool, args
    return CompensationStrategy.NONE, "", None


def pivot_warnings_for_new(*, run: Run, action_class: str, tool: str) -> list[dict[str, Any]]:
    """A compensatable step recorded after an irreversible one breaks the saga order
    (compensatable steps first, the pivot last, only retriable steps after it)."""
    if action_class not in COMPENSATABLE_CLASSES:
        return []
    # Two columns, no model instance: this runs on every append of a compensatable action.
    pivot = (
        Action.objects.filter(run=run, action_class=ActionClass.EXTERNAL_IRREVERSIBLE)
        .exclude(status__in=[Action.Status.REJECTED, Action.Status.FAILED])
        .order_by("seq")
        .values_list("pk", "tool")
        .first()
    )
    if pivot is None:
        return []
    pivot_id, pivot_tool = pivot
    return [
        {
            "code": "pivot_order",
            "message": (
                f"{tool} can be undone but was recorded after the irreversible {pivot_tool} ({pivot_id}); "
                "compensatable steps should come before the pivot."
            ),
            "pivot_action_id": pivot_id,
        }
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
    lock_timeout_ms: int = 5000,
) -> RecordedAction:
    """Record a planned action, idempotently per (tenant, idempotency key).

    Same key and payload → the existing action (with its result once succeeded); another payload
    → ``IdempotencyKeyReused``. Concurrent duplicates serialise on an advisory lock for the key:
    the first inserts, the rest then see its row; one that waits longer than ``lock_timeout_ms``
    for a stuck first request gets ``IdempotencyKeyInFlight``.
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
            return RecordedAction(
                _action_insert(
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
                    payload_hash=payload_hash,
                ),
                created=True,
            )
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
    if existing.run_id != run.pk and not Run.objects.filter(pk=run.pk, tenant_id=run.tenant_id).exists():
        # ``run`` may be a reference built from the client's run id: an unknown (or another
        # tenant's) run is a 404 whatever the key, as it was before the key was looked at.
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
    payload_hash: str,
) -> Action:
    locked = _lock_run(run, policy_stamp=True)
    _assert_accepts_actions(locked)
    policy = policy_resolve(tenant=locked.tenant, tool=tool, stamp=locked.policy_stamp)
    strategy, comp_tool, comp_args = _compensation_for(
        policy, tool=tool, args=args, compensation=compensation
    )
    warnings = pivot_warnings_for_new(run=locked, action_class=policy.action_class, tool=tool)
    if strategy == CompensationStrategy.NONE and policy.action_class == ActionClass.EXTERNAL_IRREVERSIBLE:
        warnings.append(
            {
                "code": "irreversible_without_correction",
                "message": f"{tool} is irreversible and has no correction registered.",
            }
        )
    seq = locked.action_count + 1
    action = Action.objects.create(
        tenant_id=locked.tenant_id,
        run=locked,
        seq=seq,
        tool=tool,
        target_type=target_type,
        target_id=target_id,
        args=args,
        idempotency_key=idempotency_key,
        payload_hash=payload_hash,
        intent=intent,
        before_snapshot=before_snapshot,
        risk=policy.risk,
        action_class=policy.action_class,
        approval_mode=policy.approval,
        requires_approval=policy.requires_approval,
        policy=policy.as_dict(),
        compensation_strategy=strategy,
        compensation_tool=comp_tool,
        compensation_args=comp_args,
        warnings=warnings,
    )
    audit_record(
        tenant=locked.tenant,
        run=locked,
        actor=actor,
        kind="action.recorded",
        subject=action,
        to_state=action.status,
        data={"tool": tool, "target_id": target_id, "risk": policy.risk, "idempotency_key": idempotency_key},
        # The sequence number moves with the chain head, under the run's row lock.
        run_updates={"action_count": seq},
    )
    return action


def _action_transition(
    *,
    action: Action,
    to: str,
    actor: Actor,
    kind: str,
    reason: str = "",
    updates: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    allowed_from: Iterable[str] | None = None,
    current: str | None = None,
    run_updates: dict[str, Any] | None = None,
) -> Action:
    previous = _compare_and_set(
        action, table=ACTION_TRANSITIONS, to=to, updates=updates, allowed_from=allowed_from, current=current
    )
    audit_record(
        tenant=action.run.tenant,
        run=action.run,
        actor=actor,
        kind=kind,
        subject=action,
        from_state=previous,
        to_state=to,
        reason=reason,
        data=data,
        run_updates=run_updates,
    )
    return action


@transaction.atomic
def action_await_approval(*, action: Action, actor: Actor) -> Action:
    return _action_transition(
        action=action, to=Action.Status.AWAITING_APPROVAL, actor=actor, kind="action.awaiting_approval"
    )


@transaction.atomic
def action_approve(*, action: Action, actor: Actor, reason: str, args: Any = None) -> Action:
    """awaiting_approval → approved; ``args`` replaces the action's args when the approver edited
    them (the approval service has already audited both versions)."""
    updates: dict[str, Any] = {}
    if args is not None:
        updates["args"] = args
    return _action_transition(
        action=action,
        to=Action.Status.APPROVED,
        actor=actor,
        kind="action.approved",
        reason=reason,
        updates=updates,
    )


@transaction.atomic
def action_reject(*, action: Action, actor: Actor, reason: str) -> Action:
    return _action_transition(
        action=action,
        to=Action.Status.REJECTED,
        actor=actor,
        kind="action.rejected",
        reason=reason,
        updates={"error": reason},
    )


@transaction.atomic
def action_start(*, action: Action, actor: Actor) -> Action:
    """planned/approved/failed → running, attempts + 1. Gated actions explain why they may not."""
    action.run = run = _lock_run(action.run)  # fresh, with its audit chain head
    _assert_accepts_actions(run)
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
        action=action,
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
    action.run = run = _lock_run(action.run)  # fresh, with its audit chain head
    if not reconciled:
        # A background job that finishes after the run was cancelled, closed or handed to an unwind
        # cannot write (API.md); an operator reconciling an unknown outcome still may.
        _assert_accepts_actions(run)
    completion_seq = run.completion_count + 1
    allowed = [Action.Status.UNKNOWN] if reconciled else [Action.Status.RUNNING]
    updates: dict[str, Any] = {"completion_seq": completion_seq, "completed_at": timezone.now()}
    if result is not None or not reconciled:
        updates["result"] = result
    if after_snapshot is not None:
        updates["after_snapshot"] = after_snapshot
    _action_transition(
        action=action,
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
    action.run = _lock_run(action.run)  # fresh, with its audit chain head
    _assert_accepts_actions(action.run)
    to = Action.Status.UNKNOWN if outcome_unknown else Action.Status.FAILED
    return _action_transition(
        action=action,
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
    if not reason.strip():
        raise errors.ValidationFailed(
            "A reason is required to reconcile an unknown outcome.", details={"reason": "required"}
        )
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
        action=action,
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
        action=action,
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
        action=action,
        to=targets[outcome],
        actor=actor,
        kind=f"action.compensation_{outcome}",
        reason=reason,
        data={"step_id": step_id, "state": state},
        allowed_from=[Action.Status.COMPENSATING],
    )


# --- Checkpoints -----------------------------------------------------------------------------


@transaction.atomic
def checkpoint_write(
    *,
    run: Run,
    actor: Actor,
    name: str,
    state: dict[str, Any] | None = None,
    completed_action_ids: list[str] | None = None,
    pending_action_ids: list[str] | None = None,
    requires_user_approval: bool = False,
    recovery_mode: str = Checkpoint.RecoveryMode.RESUME_OR_COMPENSATE,
    recovery_instructions: str = "",
    summary: str = "",
    trace_links: list[Any] | None = None,
) -> Checkpoint:
    locked = _lock_run(run)
    # A cancelled run is over for its agent too: a late job's checkpoint would become the one a
    # resume preview offers.
    if locked.status in (Run.Status.CANCELLED, Run.Status.COMPENSATED, Run.Status.CLOSED):
        raise errors.RunNotAcceptingActions(
            f"Run {run.pk} is {locked.status}; it takes no more checkpoints.",
            details={"run_id": run.pk, "current": locked.status},
        )
    referenced = set(completed_action_ids or []) | set(pending_action_ids or [])
    if referenced:
        known = set(Action.objects.filter(run=locked, pk__in=referenced).values_list("pk", flat=True))
        missing = sorted(referenced - known)
        if missing:
            raise errors.ValidationFailed(
                "Some action ids do not belong to this run.", details={"unknown_action_ids": missing}
            )
    if recovery_mode not in Checkpoint.RecoveryMode.values:
        raise errors.ValidationFailed(
            f"recovery_mode must be one of {', '.join(Checkpoint.RecoveryMode.values)}.",
            details={"recovery_mode": recovery_mode},
        )
    checkpoint = Checkpoint.objects.create(
        tenant_id=locked.tenant_id,
        run=locked,
        name=name,
        state=state or {},
        completed_action_ids=completed_action_ids or [],
        pending_action_ids=pending_action_ids or [],
        requires_user_approval=requires_user_approval,
        recovery_mode=recovery_mode,
        recovery_instructions=recovery_instructions,
        summary=summary,
        trace_links=trace_links or [],
        completion_mark=locked.completion_count,
    )
    audit_record(
        tenant=locked.tenant,
        run=locked,
        actor=actor,
        kind="checkpoint.written",
        subject=checkpoint,
        data={"name": name, "recovery_mode": recovery_mode},
    )
    return checkpoint


# --- Dashboard staff -------------------------------------------------------------------------

# Tenant admins reach the Django admin through this group: view rights on the record and the
# decisions, plus revoking keys. The admin itself scopes every list to their tenants.
TENANT_ADMIN_GROUP = "Saga tenant admins"


def _tenant_admin_group() -> Any:
    from django.contrib.auth.models import Group, Permission

    group, _ = Group.objects.get_or_create(name=TENANT_ADMIN_GROUP)
    wanted = Permission.objects.filter(
        content_type__app_label__in=["ledger", "recovery"], codename__startswith="view_"
    )
    wanted = wanted | Permission.objects.filter(content_type__app_label="ledger", codename="change_agentkey")
    group.permissions.set(wanted)
    return group


@transaction.atomic
def membership_set(*, user: Any, tenant: Tenant, role: str, actor: Actor) -> Membership:
    """Give ``user`` exactly ``role`` in ``tenant`` (one role per tenant), and Django admin access
    exactly while they are an admin somewhere."""
    if role not in Membership.Role.values:
        raise errors.ValidationFailed(
            f"role must be one of {', '.join(Membership.Role.values)}.", details={"role": role}
        )
    membership = Membership.objects.select_for_update().filter(user=user, tenant=tenant).first()
    previous = membership.role if membership else ""
    if membership is None:
        membership = Membership.objects.create(user=user, tenant=tenant, role=role)
    elif membership.role != role:
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.role = role
    if previous != role:
        audit_record(
            tenant=tenant,
            actor=actor,
            kind="membership.set",
            subject=membership,
            from_state=previous,
            to_state=role,
            data={"user": user.get_username()},
        )
    _sync_staff_access(user)
    return membership


def _sync_staff_access(user: Any) -> None:
    is_admin = Membership.objects.filter(user=user, role=Membership.Role.ADMIN).exists()
    group = _tenant_admin_group()
    if is_admin:
        user.groups.add(group)
    else:
        user.groups.remove(group)
    staff = is_admin or user.is_superuser
    if user.is_staff != staff:
        user.is_staff = staff
        user.save(update_fields=["is_staff"])


@transaction.atomic
def membership_remove(*, membership: Membership, actor: Actor) -> None:
    """Take a user out of a tenant (and out of the Django admin if that was their last admin role)."""
    user, tenant, role = membership.user, membership.tenant, membership.role
    if Membership.objects.filter(pk=membership.pk).delete()[0] != 1:
        raise errors.NotFound(f"Membership {membership.pk} does not exist.")
    audit_record(
        tenant=tenant,
        actor=actor,
        kind="membership.removed",
        subject=f"membership:{membership.pk}",
        from_state=role,
        data={"user": user.get_username()},
    )
    _sync_staff_access(user)


@dataclass(frozen=True)
class StaffResult:
    user: Any
    membership: Membership
    user_created: bool


@transaction.atomic
def staff_set(
    *, username: str, password: str, tenant: Tenant, role: str, actor: Actor, email: str = ""
) -> StaffResult:
    """Create or update a dashboard user: set the password and the role in ``tenant``."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError as DjangoValidationError

    username = username.strip()
    if not username:
        raise errors.ValidationFailed("A username is required.", details={"username": "required"})
    user_model = get_user_model()
    user = user_model.objects.select_for_update().filter(username=username).first()
    created = user is None
    if user is None:
        user = user_model(username=username, email=email)
    elif email:
        user.email = email
    try:
        validate_password(password, user=user)
    except DjangoValidationError as exc:
        raise errors.ValidationFailed(
            "The password is too weak: " + " ".join(exc.messages), details={"password": exc.messages}
        ) from None
    user.set_password(password)
    user.save()
    membership = membership_set(user=user, tenant=tenant, role=role, actor=actor)
    user.refresh_from_db()
    return StaffResult(user=user, membership=membership, user_created=created)
