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

The same contacts over plain HTTP JSON, for an agent that is not an MCP client (the TypeScript
client's tests: the agent acts over HTTP, the worker undoes over MCP, on one state):

- ``GET /contacts/{id}`` → ``{"contact": {...}}`` (404 ``{"error"}`` for an unknown contact);
- ``PATCH /contacts/{id}`` with ``{"email"?, "phone"?}`` → ``{"id", "updated": true}``, applied
  unless ``ignore_updates`` (404 as above, 400 for a body that is not such an object).

Both are journaled as the tools are (``get_contact`` and ``update_contact``, with ``"via": "http"``).
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
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

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


def _journal(tool: str, args: dict[str, Any], **extra: str) -> None:
    path = os.environ.get("CRM_JOURNAL")
    if path:
        with open(path, "a", encoding="utf-8") as journal:
            entry = {"tool": tool, "args": args, "at": time.time(), **extra}
            journal.write(json.dumps(entry, sort_keys=True) + "\n")


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
    return _update(id, email=email, phone=phone)


def _update(contact_id: str, *, email: str | None, phone: str | None) -> dict[str, Any]:
    with _state() as state:
        contact = _contact(state, contact_id)
        if not state.get("ignore_updates"):
            contact.update({k: v for k, v in (("email", email), ("phone", phone)) if v is not None})
            state["contacts"][contact_id] = contact
        return {"id": contact_id, "updated": True}


# --- The same over plain HTTP JSON --------------------------------------------------------------


@mcp.custom_route("/contacts/{id}", methods=["GET", "PATCH"])
async def contact_http(request: Request) -> Response:
    contact_id = str(request.path_params["id"])
    if request.method == "GET":
        _journal("get_contact", {"id": contact_id}, via="http")
        try:
            with _state() as state:
                return JSONResponse({"contact": _contact(state, contact_id)})
        except ToolError as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        body = None
    fields = ("email", "phone")
    if (
        not isinstance(body, dict)
        or set(body) - set(fields)
        or any(not isinstance(body.get(f), str | None) for f in fields)
    ):
        return JSONResponse(
            {"error": "The body must be an object of email and/or phone strings."}, status_code=400
        )
    _journal(
        "update_contact",
        {"id": contact_id, "email": body.get("email"), "phone": body.get("phone")},
        via="http",
    )
    try:
        return JSONResponse(_update(contact_id, email=body.get("email"), phone=body.get("phone")))
    except ToolError as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="CRM test MCP server (state in $CRM_STATE).")
    parser.add_argument("--http", metavar="HOST:PORT", required=True)
    args = parser.parse_args(argv)
    host, _, port = args.http.rpartition(":")
    app: Any = mcp.streamable_http_app(host=host or "127.0.0.1")
    uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
