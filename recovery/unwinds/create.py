"""Creating an unwind: the plan frozen into persisted steps, and its first advance handed to a
job after commit.
"""

from __future__ import annotations

from dataclasses import asdict

from django.db import IntegrityError, transaction
from django.utils import timezone

from infra import errors, ids, tracing
from ledger.audit import Actor, audit_record
from ledger.models import Run
from ledger.policies.resolve import policy_settings_for
from recovery.models import RecoveryItem, Unwind, UnwindStep
from recovery.planner import Plan
from recovery.unwinds.dispatch import enqueue_advance


def unwind_create(
    *, run: Run, item: RecoveryItem | None, plan: Plan, actor: Actor, reason: str, automatic: bool = False
) -> Unwind:
    """Freeze ``plan`` into an unwind and its steps (caller holds the transaction and has moved
    the run to ``compensating``)."""
    knobs = policy_settings_for(run.tenant).unwind_settings
    unwind_id = ids.new_unwind_id()
    # The unwind's trace (when traces are on): its steps, run by any worker, join it (infra.tracing).
    trace = tracing.unwind_span_started(unwind_id=unwind_id, run=run, automatic=automatic)
    frozen = {**plan.as_dict(), "settings": asdict(knobs), **({"trace": trace} if trace else {})}
    try:
        with transaction.atomic():
            unwind = Unwind.objects.create(
                id=unwind_id,
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
    enqueue_advance(unwind.pk)
    return unwind
