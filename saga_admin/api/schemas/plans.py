"""A plan: several planned actions of one run recorded in one request (each the body of a single
record, its idempotency key required in it), and the plan as recorded."""

from __future__ import annotations

from ninja import Schema
from pydantic import Field

from ledger.services.actions.plans import MAX_PLAN_ACTIONS
from saga_admin.api.schemas.actions import ActionIn, ActionOut
from saga_admin.api.schemas.common import JSONObject, StrictIn


class PlannedActionIn(ActionIn):
    # A plan has no header per action: each action carries its own key.
    idempotency_key: str = Field(
        min_length=1,
        max_length=255,
        pattern=r"^[\x21-\x7e]+$",
        description="Required, and unique within the plan. A plan whose keys were all recorded before "
        "(each with the same payload) is a replay.",
    )


class ActionPlanIn(StrictIn):
    actions: list[PlannedActionIn] = Field(
        min_length=1,
        max_length=MAX_PLAN_ACTIONS,
        description=f"1 to {MAX_PLAN_ACTIONS} actions, in the order the agent means to run them.",
    )


class ActionPlanOut(Schema):
    actions: list[ActionOut] = Field(description="The plan's actions, in its order.")
    warnings: list[JSONObject] = Field(
        description="The pivot lint over the plan: a step that can be undone after an irreversible one "
        "(`pivot_order`, naming both: `action_id` and `pivot_action_id`)."
    )
