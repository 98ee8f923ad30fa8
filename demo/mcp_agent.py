"""The demo's MCP agent: an onboarding agent that reaches its HR tools over the Model Context
Protocol instead of through the Python client. It knows nothing of Saga Admin — it is pointed at
make run's ``saga-mcp`` gateway as it would be at the HR server itself (the SDK's ``mcp.Client``
over Streamable HTTP), and the gateway records its session as a run.

Its one story: create the hire's user, assign a licence, send the welcome email to the personal
address — which the model copied with a doubled ``@``, so the mail server refuses it. The session
ends with a failed call, its run lands in the recovery queue, and compensating it calls the HR
server's ``revoke_license`` then ``delete_user`` through MCP compensators (``people.*`` in
``demo/policies/native.json``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from mcp import Client
from mcp_types import CallToolResult, Implementation
from saga_client import Saga
from saga_client.responses import RunDict

# The gateway's --agent under make run: every MCP session through it is a run of this agent.
AGENT = "mcp-agent"
# The gateway's --namespace: the tools are recorded as people.create_user, … (the demo world's
# own HR tools are hr.*).
NAMESPACE = "people"
# Who this agent says it is in the MCP handshake; the gateway keeps it in the run's metadata, which
# is how a second seed finds the run of an earlier one.
CLIENT = Implementation(name="saga-demo-onboarding-agent", version="1.0")
CLIENT_LABEL = f"{CLIENT.name} {CLIENT.version}"

HIRE = {
    "name": "Sofia Marino",
    "email": "sofia.marino@acme.example",
    "sku": "business-standard",
    # As the model copied it from the offer letter.
    "personal_email": "sofia.marino@@outlook.example",
}


def session_calls() -> list[tuple[str, dict[str, Any]]]:
    """The three tool calls of the onboarding session, in order."""
    return [
        ("create_user", {"email": HIRE["email"], "name": HIRE["name"]}),
        ("assign_license", {"email": HIRE["email"], "sku": HIRE["sku"]}),
        (
            "send_email",
            {
                "to": HIRE["personal_email"],
                "subject": "Welcome to Acme, Sofia!",
                "body": f"Hi Sofia, your account {HIRE['email']} is ready. See you on your first day.",
            },
        ),
    ]


async def onboarding_session(gateway_url: str) -> list[CallToolResult]:
    """One MCP session (the initialize handshake, so one run) of up to three calls. Like any
    agent it stops at the first tool error; closing the session (the client's DELETE) is what
    ends the run."""
    results: list[CallToolResult] = []
    async with Client(gateway_url, mode="legacy", client_info=CLIENT, read_timeout_seconds=60) as client:
        for tool, args in session_calls():
            result = await client.call_tool(tool, args)
            results.append(result)
            if result.is_error:
                break
    return results


def session_run(saga: Saga) -> RunDict | None:
    """The run of this agent's session, if one was recorded (newest first)."""
    for run in saga.list_runs(agent=AGENT):
        if (run.get("metadata") or {}).get("mcp_client") == CLIENT_LABEL:
            return run
    return None


def seed_session(
    *,
    base_url: str,
    key: str,
    gateway_url: str,
    timeout_s: float = 30.0,
    log: Callable[[str], None] = print,
) -> RunDict | None:
    """Play the session through the gateway unless its run already exists; return the new run
    once the gateway has ended it (failed, in the recovery queue), or None when it was there.

    ``key`` is the gateway's own key (the one make run gives it): the runs are that agent's, so
    only its key sees them."""
    with Saga(base_url, key) as saga:
        if session_run(saga) is not None:
            return None
        results = asyncio.run(onboarding_session(gateway_url))
        refused = results[-1]
        # The gateway ends the run when the session closes, a moment after the client's DELETE
        # is answered: wait for it, so that what the seed reports is already in the queue.
        deadline = time.monotonic() + timeout_s
        while True:
            run = session_run(saga)
            if run is not None and run["status"] != "running":
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"The MCP session's run did not end within {timeout_s:g} s of the session closing "
                    f"(the gateway at {gateway_url} ends it); is the gateway running?"
                )
            time.sleep(0.2)
    what = "failed into the recovery queue" if run["status"] == "failed" else run["status"]
    said = " ".join(getattr(block, "text", "") for block in refused.content) if refused.is_error else ""
    log(
        f"  acme/{AGENT}: MCP onboarding session through saga-mcp, {what}"
        + (f" ({said[:200]})" if said else "")
    )
    return run
