"""A real MCP server (the SDK's ``MCPServer``) that counts what reaches it, for the gateway's
replay tests: run over stdio (``python mcp_probe.py``) or Streamable HTTP (``--http HOST:PORT``).

``hold(tag)`` appends the call to the JSON-lines file ``PROBE_JOURNAL`` names, then holds the call
until the file ``PROBE_RELEASE`` names exists (at most 60 s), so a test can send a request again
while the first is provably still running upstream. Its result is not what a plain tool returns
(two text blocks, one with annotations, structured content and ``_meta``): a replay must give back
all of it, not only what the ledger's ``result`` shows.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.mcpserver import MCPServer

probe = MCPServer("probe", version="1.0.0")


@probe.tool()
def hold(tag: str) -> types.CallToolResult:
    """Record the call, wait for the test's release, answer with a rich result."""
    journal = os.environ["PROBE_JOURNAL"]
    with open(journal, "a", encoding="utf-8") as out:
        out.write(json.dumps({"tool": "hold", "tag": tag, "at": time.time()}) + "\n")
    count = sum(1 for line in Path(journal).read_text().splitlines() if line.strip())
    release = Path(os.environ["PROBE_RELEASE"])
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # a bounded poll for the test's signal, not a pause for effect
    return types.CallToolResult(
        content=[
            types.TextContent(type="text", text=f"held {tag}"),
            types.TextContent(
                type="text", text=f"call number {count}", annotations=types.Annotations(priority=0.25)
            ),
        ],
        structured_content={"tag": tag, "call": count},
        _meta={"probe/served-by": os.getpid()},
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", metavar="HOST:PORT")
    args = parser.parse_args()
    if args.http:
        host, _, port = args.http.rpartition(":")
        app: Any = probe.streamable_http_app(host=host)
        uvicorn.run(app, host=host, port=int(port), log_level="warning")
    else:
        probe.run()


if __name__ == "__main__":
    main()
