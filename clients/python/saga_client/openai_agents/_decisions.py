"""``saga_decisions``: the run state to resume an interrupted SDK run with, each interruption of a
Saga tool decided as Saga Admin's approver decided it."""

from __future__ import annotations

import json
from typing import Any

from agents.result import RunResult, RunResultStreaming
from agents.run_state import RunState

from saga_client.errors import ApprovalRejected, rejection_for, rejection_words
from saga_client.openai_agents._tools import _active_run, _call, _record


async def saga_decisions(
    result: RunResult | RunResultStreaming, *, wait: bool = True, timeout_s: float | None = None
) -> RunState[Any]:
    """The run state to resume ``result`` with, its interruptions decided as Saga Admin's approver
    decided them (waiting for the decisions unless ``wait=False``: an undecided call then stays
    interrupted). ``ApprovalTimeout`` when nobody decided within ``timeout_s``."""
    state = result.to_state()
    for item in result.interruptions:
        tools = getattr(item.agent, "tools", ())
        spec = next(
            (t._saga_spec for t in tools if t.name == item.tool_name and hasattr(t, "_saga_spec")), None
        )
        if spec is None:
            continue  # not a Saga tool: the host decides it
        action = await _record(spec, json.loads(item.arguments or "{}"))
        try:
            if wait and action["status"] == "awaiting_approval":
                action = await _call(
                    _active_run(spec.name).client.wait_for_approval, action, timeout_s=timeout_s
                )
            if action["status"] == "rejected":
                raise rejection_for(action)
        except ApprovalRejected as rejected:
            # A rejection by a person or by the approval deadline (ApprovalDeadlinePassed): the SDK's
            # own rejection either way, saying which.
            state.reject(item, rejection_message=rejection_words(spec.name, rejected))
            continue
        if action["status"] != "awaiting_approval":
            state.approve(item)
    return state
