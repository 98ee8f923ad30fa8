"""The demo's MCP agent: an onboarding agent that reaches its HR tools over the Model Context
Protocol instead of through the Python client. It knows nothing of Saga Admin — it is pointed at
make run's ``saga-mcp`` gateway as it would be at the HR server itself (the SDK's ``mcp.Client``
over Streamable HTTP), and the gateway records its session as a run.

Its first story: create the hire's user, assign a licence, send the welcome email to the personal
address — which the model copied with a doubled ``@``, so the mail server refuses it. The session
ends with a failed call, its run lands in the recovery queue, and compensating it calls the HR
server's ``revoke_license`` then ``delete_user`` through MCP compensators (``people.*`` in
``demo/policies/native.json``).

Its second story (``seed_promotion_session``, as another MCP client): Priya Raman's promotion. It
changes her job title (``update_title``, whose policy has a ``before``: the gateway reads her record
with ``get_user`` before and after the call and records both images), then asks for the licence
managers get under a SKU that does not exist, and the session fails into the queue. Compensating it
calls ``update_title`` with the title the gateway read before, and the worker reads it back through
the ``people.get_user`` reader to verify the undo.
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


# The promotion session's MCP client, and its calls: Priya Raman is in the demo server's starting
# directory (HR_MCP_DIRECTORY=acme) as "Support lead".
PROMOTION_CLIENT = Implementation(name="saga-demo-hr-agent", version="1.0")
PROMOTION_CLIENT_LABEL = f"{PROMOTION_CLIENT.name} {PROMOTION_CLIENT.version}"
PROMOTED = {"email": "priya.raman@acme.example", "title": "Support manager", "sku": "business-premium"}


def promotion_calls() -> list[tuple[str, dict[str, Any]]]:
    """The promotion session's two calls: the new title, then the managers' licence under a SKU
    the model made up (the server knows business-plus)."""
    return [
        ("update_title", {"email": PROMOTED["email"], "title": PROMOTED["title"]}),
        ("assign_license", {"email": PROMOTED["email"], "sku": PROMOTED["sku"]}),
    ]


async def play_session(
    gateway_url: str,
    calls: list[tuple[str, dict[str, Any]]] | None = None,
    client_info: Implementation = CLIENT,
) -> list[CallToolResult]:
    """One MCP session (the initialize handshake, so one run) of ``calls`` (the onboarding ones by
    default). Like any agent it stops at the first tool error; closing the session (the client's
    DELETE) is what ends the run."""
    results: list[CallToolResult] = []
    async with Client(gateway_url, mode="legacy", client_info=client_info, read_timeout_seconds=60) as client:
        for tool, args in session_calls() if calls is None else calls:
            result = await client.call_tool(tool, args)
            results.append(result)
            if result.is_error:
                break
    return results


async def onboarding_session(gateway_url: str) -> list[CallToolResult]:
    """The onboarding session: up to three calls."""
    return await play_session(gateway_url)


def session_run(saga: Saga, label: str = CLIENT_LABEL) -> RunDict | None:
    """The run of this agent's session as the MCP client ``label`` (the onboarding one by
    default), if one was recorded (newest first)."""
    for run in saga.list_runs(agent=AGENT):
        if (run.get("metadata") or {}).get("mcp_client") == label:
            return run
    return None


def _seed(
    *,
    base_url: str,
    key: str,
    gateway_url: str,
    calls: list[tuple[str, dict[str, Any]]],
    client_info: Implementation,
    story: str,
    timeout_s: float,
    log: Callable[[str], None],
) -> RunDict | None:
    label = f"{client_info.name} {client_info.version}"
    with Saga(base_url, key) as saga:
        if session_run(saga, label) is not None:
            return None
        results = asyncio.run(play_session(gateway_url, calls, client_info))
        refused = results[-1]
        # The gateway ends the run when the session closes, a moment after the client's DELETE
        # is answered: wait for it, so that what the seed reports is already in the queue.
        deadline = time.monotonic() + timeout_s
        while True:
            run = session_run(saga, label)
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
        f"  acme/{AGENT}: MCP {story} session through saga-mcp, {what}" + (f" ({said[:200]})" if said else "")
    )
    return run


def seed_session(
    *,
    base_url: str,
    key: str,
    gateway_url: str,
    timeout_s: float = 30.0,
    log: Callable[[str], None] = print,
) -> RunDict | None:
    """Play the onboarding session through the gateway unless its run already exists; return the
    new run once the gateway has ended it (failed, in the recovery queue), or None when it was
    there.

    ``key`` is the gateway's own key (the one make run gives it): the runs are that agent's, so
    only its key sees them."""
    return _seed(
        base_url=base_url,
        key=key,
        gateway_url=gateway_url,
        calls=session_calls(),
        client_info=CLIENT,
        story="onboarding",
        timeout_s=timeout_s,
        log=log,
    )


def seed_promotion_session(
    *,
    base_url: str,
    key: str,
    gateway_url: str,
    timeout_s: float = 30.0,
    log: Callable[[str], None] = print,
) -> RunDict | None:
    """The promotion session, as ``seed_session`` plays the onboarding one: once (a second seed
    finds its run by its MCP client), into the recovery queue."""
    return _seed(
        base_url=base_url,
        key=key,
        gateway_url=gateway_url,
        calls=promotion_calls(),
        client_info=PROMOTION_CLIENT,
        story="promotion",
        timeout_s=timeout_s,
        log=log,
    )
