"""``resume_when_decided``: wait until Saga Admin's approver decided the approvals a graph paused
for, then the ``Command`` that resumes it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.types import Command

from saga_client.client import Run
from saga_client.errors import ApprovalRejected
from saga_client.tools import require_run, sync_run


def resume_when_decided(state: Mapping[str, Any], *, timeout_s: float | None = None) -> Command[Any]:
    """Wait (in the active blocking run) until Saga Admin's approver decided every approval the
    graph paused for, then the ``Command`` that resumes it; each interrupt's resume value is the
    decision ``{"approval_id", "action_id", "status"}`` (informational: the tool asks Saga again).
    ``ApprovalTimeout`` when nobody decided within ``timeout_s`` (default: the client's)."""
    run: Run = require_run(sync_run, "resume_when_decided", client="Saga")
    decisions = {}
    for paused in state.get("__interrupt__", ()):
        value = paused.value
        if not (isinstance(value, Mapping) and value.get("saga") == "approval_pending"):
            continue
        try:
            action = run.client.wait_for_approval(
                run.client.get_action(value["action_id"]), timeout_s=timeout_s
            )
            status = action["status"]
        except ApprovalRejected:
            status = "rejected"
        decisions[paused.id] = {"approval_id": value["approval_id"], "action_id": value["action_id"]}
        decisions[paused.id]["status"] = status
    return Command(resume=decisions)
