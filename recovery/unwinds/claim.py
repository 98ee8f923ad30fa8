"""Taking a step for a worker: queued (or pending, for the worker that advanced the unwind) →
running, with a new fencing token, a lease, and the request its compensator is called with.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from infra import errors, tracing
from ledger import upstreams
from ledger.models import Action
from ledger.services.actions import moves
from recovery import compensators
from recovery.compensators import CompensationRequest
from recovery.models import Unwind, UnwindStep
from recovery.unwinds.dispatch import step_lease_seconds, step_timeout_of
from recovery.unwinds.state import ENGINE, step_transition

if TYPE_CHECKING:
    from opentelemetry.trace import Span


@dataclass(frozen=True)
class Claim:
    step_id: str
    unwind_id: str
    token: int
    tenant_id: int
    request: CompensationRequest
    lease_s: int = 0
    # The unwind's trace context (``infra.tracing``): every step's span joins the unwind's trace.
    trace: Mapping[str, str] = field(default_factory=dict)

    def span(self) -> AbstractContextManager[Span | None]:
        """This attempt's span when traces are on (ids and names only, never args)."""
        r = self.request
        return tracing.unwind_step_span(
            self.trace,
            name=f"unwind_step {r.tool}",
            attributes={
                "gen_ai.tool.name": r.tool,
                "saga.unwind.id": self.unwind_id,
                "saga.step.id": self.step_id,
                "saga.step.attempt": r.attempt,
                "saga.action.id": r.action_id,
                "saga.run.id": r.run_id,
                "saga.tenant": r.tenant,
            },
        )


@transaction.atomic
def step_claim(*, step_id: str) -> Claim | None:
    """Take the step for this worker: None when another worker holds it, it is not due yet, or
    it is no longer queued. The lease token is the fence for recording the outcome."""
    step = (
        UnwindStep.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("unwind__run__tenant", "action")
        .filter(pk=step_id, status=UnwindStep.Status.QUEUED)
        .first()
    )
    if step is None:
        return None
    if step.next_attempt_at is not None and step.next_attempt_at > timezone.now():
        return None
    if step.unwind.status != Unwind.Status.RUNNING:
        return None
    step.action.run = step.unwind.run
    return step_start(step)


def step_start(
    step: UnwindStep, *, allowed_from: tuple[str, ...] = (UnwindStep.Status.QUEUED,)
) -> Claim | None:
    """queued (or, claimed by the worker that advanced the unwind, pending) → running with a new
    fencing token and a lease (the caller holds the step's row, or the unwind's lock, and has
    loaded the step's unwind, run, tenant and action)."""
    now = timezone.now()
    token = step.lease_token + 1
    attempt = step.attempts + 1
    lease_s = step_lease_seconds(step_timeout_s=step_timeout_of(step.unwind))
    override = bool((step.result or {}).get("override_drift")) if isinstance(step.result, dict) else False
    try:
        step_transition(
            step,
            to=UnwindStep.Status.RUNNING,
            allowed_from=allowed_from,
            actor=ENGINE,
            kind="step.started",
            updates={
                "lease_token": token,
                "attempts": attempt,
                "lease_expires_at": now + timedelta(seconds=lease_s),
                "started_at": step.started_at or now,
            },
            data={"attempt": attempt, "lease_token": token},
        )
    except errors.InvalidTransition:
        return None  # another worker took it first
    action = step.action
    if action.status in (Action.Status.SUCCEEDED, Action.Status.COMPENSATION_FAILED):
        moves.action_compensation_started(action=action, actor=ENGINE, step_id=step.pk)
    run = step.unwind.run
    request = CompensationRequest(
        step_id=step.pk,
        action_id=action.pk,
        run_id=run.pk,
        tenant=run.tenant.slug,
        tool=step.tool,
        args=step.args,
        target_type=action.target_type,
        target_id=action.target_id,
        before_snapshot=action.before_snapshot,
        after_snapshot=action.after_snapshot,
        attempt=attempt,
        idempotency_key=step.idempotency_key,
        strategy=step.strategy,
        override_drift=override,
        timeout_s=compensators.call_timeout_s(step_timeout_s=step_timeout_of(step.unwind)),
        upstream=upstreams.via_upstream(action.via),
        # A step that requires approval reaches a worker only once approved (advance_locked).
        person_approved=step.requires_approval,
        before=_before_of(action),
        action_args=action.args,
    )
    return Claim(
        step_id=step.pk,
        unwind_id=step.unwind_id,
        token=token,
        tenant_id=run.tenant_id,
        request=request,
        lease_s=lease_s,
        trace=(step.unwind.plan or {}).get("trace") or {},
    )


def _before_of(action: Action) -> dict[str, Any] | None:
    """The read the action's frozen policy names in ``before`` (None when it names none)."""
    before = action.policy.get("before") if isinstance(action.policy, dict) else None
    return before if isinstance(before, dict) else None
