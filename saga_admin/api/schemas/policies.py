"""The tool policies in force, as an agent reads them."""

from __future__ import annotations

from typing import Literal

from ninja import Schema
from pydantic import Field

from saga_admin.api.schemas.common import JSONObject, JSONValue


class ToolPolicyOut(Schema):
    tool: str
    risk: str
    approval: str
    action_class: str
    compensation: str
    compensation_tool: str
    compensation_args: JSONValue = Field(
        None, description="Templates for the compensating tool's args ($args.<path>, $result.<path>, …)."
    )
    approvers: int = Field(1, description="How many distinct people must grant an approval it asks for.")
    approval_timeout: str = Field(
        description='How long an approval it asks for waits ("2h"); SAGA_APPROVAL_EXPIRY_H when it sets none.'
    )
    on_timeout: Literal["reject", "escalate"] = Field(
        description="What its deadline does: reject, or escalate once to escalate_to (the next timeout rejects)."
    )
    escalate_to: str | None = Field(
        None, description="The role (approver, admin) or username an approval escalates to."
    )
    rules: list[JSONObject] = Field(
        default_factory=list, description="Rules on the call's args, first match wins."
    )
    limits: list[JSONObject] = Field(
        default_factory=list, description="Count and sum limits over a sliding window."
    )
    before: JSONObject | None = Field(
        None,
        description="The read that takes the before- and after-image of an update: "
        '{"tool", "args", "path"} (API.md, "Before-images and verified undo"); null: none.',
    )
    scope: Literal["tenant", "global"]
    source: str


class PoliciesOut(Schema):
    policies: list[ToolPolicyOut]
    default_policy: JSONObject
    unwind: JSONObject
    auto_compensate: JSONObject
    source: str
