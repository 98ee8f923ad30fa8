"""A small CRM MCP server (the official SDK's ``MCPServer``, Streamable HTTP) for the reader tests:
an update tool and the reads that take its before- and after-image.

    python tests/support/mcp_crm.py --http 127.0.0.1:PORT     # http://127.0.0.1:PORT/mcp

Its contacts live in the JSON file named by ``CRM_STATE`` (read and written on every call), so a
test changes a contact "by hand" by editing that file, as a person in the CRM's own UI would.
With ``"ignore_updates": true`` in that file, ``update_contact`` acknowledges and changes nothing
(a server that said yes and did not apply it). Every call is appended to ``CRM_JOURNAL``.

- ``get_contact(id)``: structured content ``{"contact": {...}}``;
- ``get_contact_text(id)``: the same as one JSON text block, no structured content;
- ``update_contact(id, email?, phone?)``: changes what it is given.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

mcp = MCPServer("crm", version="1.0.0", instructions="Contacts of Acme's CRM.")


@contextmanager
def _state() -> Iterator[dict[str, Any]]:
    path = os.environ["CRM_STATE"]
    with open(path, "r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        state = json.load(handle)
        before = json.dumps(state, sort_keys=True)
        yield state
        if json.dumps(state, sort_keys=True) != before:
            handle.seek(0)
            handle.truncate()
            json.dump(state, handle)


def _journal(tool: str, args: dict[str, Any]) -> None:
    path = os.environ.get("CRM_JOURNAL")
    if path:
        with open(path, "a", encoding="utf-8") as journal:
            journal.write(json.dumps({"tool": tool, "args": args, "at": time.time()}, sort_keys=True) + "\n")


def _contact(state: dict[str, Any], contact_id: str) -> dict[str, Any]:
    contact = state["contacts"].get(contact_id)
    if contact is None:
        raise ToolError(f"No contact {contact_id}.")
    return dict(contact)


@mcp.tool()
def get_contact(id: str) -> dict[str, Any]:  # noqa: A002 - the CRM's own argument name
    """One contact, as structured content."""
    _journal("get_contact", {"id": id})
    with _state() as state:
        return {"contact": _contact(state, id)}


@mcp.tool(structured_output=False)
def get_contact_text(id: str) -> str:  # noqa: A002
    """One contact, as a single JSON text block (no structured content)."""
    _journal("get_contact_text", {"id": id})
    with _state() as state:
        return json.dumps({"contact": _contact(state, id)})


@mcp.tool()
def update_contact(id: str, email: str | None = None, phone: str | None = None) -> dict[str, Any]:  # noqa: A002
    """Change a contact's email and/or phone."""
    _journal("update_contact", {"id": id, "email": email, "phone": phone})
    with _state() as state:
        contact = _contact(state, id)
        if not state.get("ignore_updates"):
            contact.update({k: v for k, v in (("email", email), ("phone", phone)) if v is not None})
            state["contacts"][id] = contact
        return {"id": id, "updated": True}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="CRM test MCP server (state in $CRM_STATE).")
    parser.add_argument("--http", metavar="HOST:PORT", required=True)
    args = parser.parse_args(argv)
    host, _, port = args.http.rpartition(":")
    app: Any = mcp.streamable_http_app(host=host or "127.0.0.1")
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
