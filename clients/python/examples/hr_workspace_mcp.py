"""A small HR + workspace MCP server: the upstream the saga-mcp gateway is demonstrated and tested
against. Built on the official MCP SDK's ``MCPServer``; its state lives in memory (one process,
one company), so it needs nothing but ``mcp``.

    python hr_workspace_mcp.py                          # stdio (as an MCP host starts it)
    python hr_workspace_mcp.py --http 127.0.0.1:8765    # Streamable HTTP at http://127.0.0.1:8765/mcp

Forward tools and the tools that undo them:

    create_user(email, name)        ↔  delete_user(email)
    assign_license(email, sku)      ↔  revoke_license(email, sku)
    send_email(to, subject, body)   →  send_correction(to, subject, body)   (an email cannot be unsent)

``update_title(email, title)`` changes a user's job title; its undo is the same tool with the
title it replaced, which Saga Admin reads before the call with ``get_user(email)`` (a policy's
``before``: docs/MCP.md). ``list_users`` and ``get_user`` read the state.

Every call that reaches a tool other than those two reads is appended to the JSON-lines file
named by ``HR_MCP_JOURNAL`` (when set), with the ``Idempotency-Key`` header it came with, so a test
or a demo can see exactly what reached this server and in which order, whichever transport carried
it. With ``HR_MCP_DIRECTORY=acme`` the directory starts with Acme's employees (``DIRECTORIES``), as
``make run``'s demo does; by default it starts empty. With ``HR_MCP_TOKEN`` set, the HTTP endpoint
answers 401 unless a request carries ``Authorization: Bearer <token>`` (what a Saga Admin MCP
compensator's ``headers_env`` is for).

Failures are tool errors (``isError``, raised as ``ToolError`` so the message reaches the caller), as
a real server's would be: creating a user that exists,
licensing a user that does not, an unknown SKU, or mailing an address that is not one (a doubled
``@``, as a model copying a personal address may write) or is at ``.invalid`` (RFC 2606's
never-resolving domain). The undo tools are idempotent: undoing what is already undone succeeds
and says so, because a compensation may be retried.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import time
from typing import Annotated, Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

SKUS = ("business-starter", "business-standard", "business-plus")

mcp = MCPServer(
    "hr-workspace",
    version="1.0.0",
    instructions="HR directory and workspace licenses of Acme. Every change can be undone.",
)

_users: dict[str, dict[str, Any]] = {}
_licenses: dict[tuple[str, str], dict[str, Any]] = {}
_outbox: list[dict[str, Any]] = []
_titles: dict[str, str] = {}
_next_id = {"user": 1000, "license": 1, "message": 1}


def _journal(ctx: Context, tool: str, args: dict[str, Any]) -> None:
    path = os.environ.get("HR_MCP_JOURNAL")
    if not path:
        return
    headers = ctx.headers or {}
    entry = {"tool": tool, "args": args, "idempotency_key": headers.get("idempotency-key"), "at": time.time()}
    with open(path, "a", encoding="utf-8") as journal:
        journal.write(json.dumps(entry, sort_keys=True) + "\n")


def _new_id(kind: str) -> int:
    _next_id[kind] += 1
    return _next_id[kind]


Email = Annotated[str, Field(description="The person's work email address", min_length=3, max_length=254)]


@mcp.tool()
def create_user(
    email: Email, name: Annotated[str, Field(min_length=1, max_length=200)], ctx: Context
) -> dict[str, Any]:
    """Create a user in the HR directory."""
    _journal(ctx, "create_user", {"email": email, "name": name})
    if email in _users:
        raise ToolError(f"A user {email} already exists.")
    user = {"user_id": f"u_{_new_id('user')}", "email": email, "name": name}
    _users[email] = user
    return user


@mcp.tool()
def delete_user(email: Email, ctx: Context) -> dict[str, Any]:
    """Delete a user from the HR directory (undoes create_user). Deleting a user who does not exist
    succeeds: the user is gone either way."""
    _journal(ctx, "delete_user", {"email": email})
    user = _users.pop(email, None)
    _titles.pop(email, None)
    return {"email": email, "deleted": user is not None}


@mcp.tool()
def assign_license(
    email: Email, sku: Annotated[str, Field(description=f"One of {', '.join(SKUS)}")], ctx: Context
) -> dict[str, Any]:
    """Assign a workspace license to an existing user."""
    _journal(ctx, "assign_license", {"email": email, "sku": sku})
    if email not in _users:
        raise ToolError(f"No user {email}: create the user first.")
    if sku not in SKUS:
        raise ToolError(f"Unknown SKU {sku!r}; one of {', '.join(SKUS)}.")
    license_ = _licenses.setdefault(
        (email, sku), {"license_id": f"lic_{_new_id('license')}", "email": email, "sku": sku}
    )
    return license_


@mcp.tool()
def revoke_license(email: Email, sku: str, ctx: Context) -> dict[str, Any]:
    """Revoke a workspace license (undoes assign_license). Revoking one that is not assigned succeeds."""
    _journal(ctx, "revoke_license", {"email": email, "sku": sku})
    license_ = _licenses.pop((email, sku), None)
    return {"email": email, "sku": sku, "revoked": license_ is not None}


@mcp.tool()
def send_email(
    to: Email,
    subject: Annotated[str, Field(max_length=500)],
    body: Annotated[str, Field(max_length=20000)],
    ctx: Context,
) -> dict[str, Any]:
    """Send an email. It cannot be unsent: its compensation is a correction."""
    _journal(ctx, "send_email", {"to": to, "subject": subject, "body": body})
    local, at, domain = to.partition("@")
    if not local or not at or "@" in domain:
        raise ToolError(f"Mail to {to} bounced: {to} is not an email address (one @, a name before it).")
    if not domain or domain.endswith(".invalid") or "." not in domain:
        raise ToolError(f"Mail to {to} bounced: the domain {domain or '(none)'} does not accept mail.")
    message = {"message_id": f"msg_{_new_id('message')}", "to": to, "subject": subject}
    _outbox.append({**message, "body": body})
    return message


@mcp.tool()
def send_correction(to: Email, subject: str, ctx: Context, body: str = "") -> dict[str, Any]:
    """Send a correction for an email sent by mistake (the compensation of send_email)."""
    _journal(ctx, "send_correction", {"to": to, "subject": subject, "body": body})
    message = {"message_id": f"msg_{_new_id('message')}", "to": to, "subject": f"Correction: {subject}"}
    _outbox.append({**message, "body": body or "Please disregard the previous message."})
    return message


@mcp.tool()
def list_users() -> dict[str, Any]:
    """The directory: users and the licenses they hold."""
    return {
        "users": [
            {**user, "licenses": sorted(sku for (email, sku) in _licenses if email == user["email"])}
            for user in sorted(_users.values(), key=lambda u: u["email"])
        ],
        "emails_sent": len(_outbox),
    }


Title = Annotated[str, Field(description="A job title: one line of text", min_length=1, max_length=200)]


@mcp.tool()
def get_user(email: Email) -> dict[str, Any]:
    """One user of the HR directory with their job title: ``{"user": {...}}``."""
    user = _users.get(email)
    if user is None:
        raise ToolError(f"No user {email}.")
    return {"user": {**user, "title": _titles.get(email, "")}}


@mcp.tool()
def update_title(email: Email, title: Title, ctx: Context) -> dict[str, Any]:
    """Change a user's job title. Undone by calling it again with the title it replaced."""
    _journal(ctx, "update_title", {"email": email, "title": title})
    if email not in _users:
        raise ToolError(f"No user {email}: create the user first.")
    if not title.strip() or any(char in title for char in "\r\n\t"):
        raise ToolError("A job title is one line of text, not blank.")
    _titles[email] = title
    return {"user": {**_users[email], "title": title}}


# The directories a server can start with (HR_MCP_DIRECTORY): email, name, job title. Acme's are
# the employees of make run's demo world (demo/setup.py).
DIRECTORIES: dict[str, list[tuple[str, str, str]]] = {
    "acme": [
        ("jon.ives@acme.example", "Jon Ives", "COO"),
        ("priya.raman@acme.example", "Priya Raman", "Support lead"),
    ],
}


def directory_load(name: str) -> None:
    """Start from the named directory (``DIRECTORIES``); an unknown name is refused."""
    if name not in DIRECTORIES:
        raise SystemExit(f"HR_MCP_DIRECTORY={name!r}: not one of {', '.join(sorted(DIRECTORIES))}.")
    for email, person, title in DIRECTORIES[name]:
        _users[email] = {"user_id": f"u_{_new_id('user')}", "email": email, "name": person}
        _titles[email] = title


class _RequireBearer:
    """ASGI middleware: 401 unless the request carries ``Authorization: Bearer <token>``."""

    def __init__(self, app: Any, token: str) -> None:
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"text/plain")],
                    }
                )
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token"})
                return
        await self.app(scope, receive, send)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="HR + workspace demo MCP server (in memory).")
    parser.add_argument("--http", metavar="HOST:PORT", help="serve Streamable HTTP at http://HOST:PORT/mcp")
    args = parser.parse_args(argv)
    if directory := os.environ.get("HR_MCP_DIRECTORY"):
        directory_load(directory)
    if args.http:
        host, _, port = args.http.rpartition(":")
        app: Any = mcp.streamable_http_app(host=host or "127.0.0.1")
        token = os.environ.get("HR_MCP_TOKEN")
        if token:
            app = _RequireBearer(app, token)
        uvicorn.run(app, host=host or "127.0.0.1", port=int(port), log_level="warning")
    else:
        mcp.run()


if __name__ == "__main__":
    main()
