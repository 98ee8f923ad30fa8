"""Checkpoints: the safe pause points an agent writes, which a resume restarts from."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from infra import errors
from ledger.audit import Actor, audit_record
from ledger.models import Action, Checkpoint, Run
from ledger.services.runs import run_assert_accepts_writes, run_lock


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
    locked = run_lock(run)
    # The same rule as recording an action: a late job's checkpoint on a failed or cancelled run
    # would become the one a resume preview offers, and a compensating run's plan must hold still.
    run_assert_accepts_writes(locked)
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
