"""An MCP server (the SDK's, over Streamable HTTP) whose ``charge`` tool journals the call and then
dies before it answers: a connection lost after the request was sent, for the gateway tests.

    python mcp_crashing_upstream.py HOST:PORT JOURNAL
"""

from __future__ import annotations

import json
import os
import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("crashing-upstream")


@mcp.tool()
def charge(customer: str, amount: int) -> dict[str, object]:
    """Charge a customer, then crash before answering (the charge happened)."""
    with open(sys.argv[2], "a", encoding="utf-8") as journal:
        journal.write(json.dumps({"tool": "charge", "args": {"customer": customer, "amount": amount}}) + "\n")
    os._exit(1)


@mcp.tool()
def ping_tool() -> str:
    """Answer (the upstream is alive)."""
    return "pong"


if __name__ == "__main__":
    host, _, port = sys.argv[1].rpartition(":")
    uvicorn.run(mcp.streamable_http_app(host=host), host=host, port=int(port), log_level="warning")
