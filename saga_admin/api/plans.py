"""Plans: an agent records the steps it means to take, several planned actions of one run in one
request, all or nothing (``recovery.actions.approvals.plan_record_gated``, which records each as
the single record does and opens every approval the plan needs in the same transaction)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from ninja import Router

from infra.error_bodies import ErrorOut
from ledger import selectors as ledger_selectors
from recovery.actions import approvals
from saga_admin.api.auth import agent_auth
from saga_admin.api.common import WRITE_ERRORS, actor_of, check_id, key_of
from saga_admin.api.idempotency import json_response
from saga_admin.api.schemas.actions import actions_shown, approvals_shown
from saga_admin.api.schemas.plans import ActionPlanIn, ActionPlanOut

router = Router(tags=["agents"], auth=agent_auth)


@router.post(
    "/runs/{run_id}/plan",
    # 503: other plans kept deadlocking with this one (ledger.services.actions.plans).
    response={200: ActionPlanOut, 201: ActionPlanOut, **WRITE_ERRORS, 503: ErrorOut},
    summary="Record a plan: several planned actions in one request, all or nothing",
    description="Each action is the body of `POST /runs/{id}/actions` (its `idempotency_key` required, "
    "unique within the plan) and is recorded exactly as that records one — policies, rules, limits "
    "(two actions of one plan both count), pauses, the compensation rule, `start` — in one "
    "transaction, in order: a refusal of any action (409 `paused`, 403 `policy_denied`, 422 "
    "`unknown_compensator` / `compensation_not_allowed`, 409 `run_not_accepting_actions`) records "
    "nothing and names it in `details.plan_index`. Every approval the plan needs is requested at once. "
    "`warnings`: the pivot lint over the plan. 201 when recorded; 200 with `Idempotent-Replayed: true` "
    "when every key was recorded before with the same payload (the actions as they are now); a mix of "
    "new and known keys, or a known key with another payload → 422 `idempotency_key_reused`. The "
    "`Idempotency-Key` header is not used: the actions' keys are the plan's.",
)
def plan_record(request: HttpRequest, run_id: str, payload: ActionPlanIn) -> HttpResponse:
    check_id("Run", run_id)
    # A reference, not a read: each record locks the run's row scoped to this tenant and agent
    # (404 for an unknown, another tenant's or another agent's run).
    run = ledger_selectors.run_reference_for_write(key=key_of(request), run_id=run_id)
    plan = approvals.plan_record_gated(
        run=run,
        actor=actor_of(request),
        actions=[
            {
                "tool": action.tool,
                "idempotency_key": action.idempotency_key,
                "target_type": action.target_type,
                "target_id": action.target_id,
                "args": action.args,
                "intent": action.intent.model_dump(exclude_unset=True) if action.intent else {},
                "before_snapshot": action.before_snapshot,
                "compensation": action.compensation.model_dump() if action.compensation else None,
                "via": action.via.model_dump() if action.via else None,
                "start": action.start,
            }
            for action in payload.actions
        ],
    )
    shown = actions_shown(plan.actions, approvals_shown(run.pk, plan.actions))
    body = {"actions": [action.json_ready() for action in shown], "warnings": plan.warnings}
    return json_response(201, body) if plan.created else json_response(200, body, replayed=True)
