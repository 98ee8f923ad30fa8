"""The gateway's before- and after-reads: a policy's ``before`` read (``{"tool", "args", "path"}``)
made on the same upstream the call goes to, and the image it gives (``saga_client.images``).

The read is called without the gateway's ``--namespace`` prefix (the policy names tools as the
gateway records them, ``NS.NAME``; the upstream knows ``NAME``). A read on an upstream that lost
its session is sent once more on a new one (``UpstreamLink.call_tool``), and so is one whose
connection broke after it was sent: a read is harmless to repeat. Any read that gives no image
raises ``ReadFailed``, whose message names the read and why.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp import MCPError

from saga_client.images import ImageError, fill_args, image_at, read_result
from saga_client.mcp.results import result_text
from saga_client.mcp.upstream import NotReached, UpstreamLink, lost_after_sending

log = logging.getLogger(__name__)

# How long one read may take at most (the call's own time-out, when shorter, bounds it too).
READ_TIMEOUT_S = 30.0


class ReadFailed(Exception):
    """A before- or after-read gave no image; the message names the read and why."""


def upstream_name(tool: str, namespace: str) -> str:
    """``tool`` as the upstream knows it: without the gateway's namespace prefix."""
    prefix = f"{namespace}." if namespace else ""
    return tool[len(prefix) :] if prefix and tool.startswith(prefix) else tool


def read_args(before: Mapping[str, Any], args: Any) -> Any:
    """The read's args filled from the call's; ``ReadFailed`` when they cannot be."""
    try:
        return fill_args(before.get("args", {}), args=args)
    except ImageError as exc:
        raise ReadFailed(f"its args cannot be filled from the call's ({exc})") from None


async def take_image(
    upstream: UpstreamLink, before: Mapping[str, Any], args: Any, *, namespace: str, timeout_s: float
) -> Any:
    """The image the read of ``before`` gives now for a call with ``args``."""
    tool = upstream_name(str(before["tool"]), namespace)
    filled = read_args(before, args)
    if not isinstance(filled, dict):
        raise ReadFailed(f"its args are not an object ({type(filled).__name__})")
    try:
        result = await _read(upstream, tool, filled, timeout_s=min(timeout_s, READ_TIMEOUT_S))
    except NotReached as exc:
        raise ReadFailed(f"the upstream could not be reached ({exc.reason})") from None
    except TimeoutError:
        raise ReadFailed(f"it did not answer within {min(timeout_s, READ_TIMEOUT_S):g} s") from None
    except MCPError as exc:
        raise ReadFailed(f"it failed: {exc.message} (JSON-RPC {exc.code})") from None
    except Exception as exc:  # noqa: BLE001 - any failure of the read refuses the call
        raise ReadFailed(f"it failed: {type(exc).__name__}: {exc}") from None
    if result.is_error:
        raise ReadFailed(f"it answered a tool error: {result_text(result)[:500] or '(no text)'}")
    texts = [block.text for block in result.content if isinstance(block, types.TextContent)]
    try:
        return image_at(read_result(structured=result.structured_content, texts=texts), before.get("path"))
    except ImageError as exc:
        raise ReadFailed(str(exc)) from None


async def _read(upstream: UpstreamLink, tool: str, args: dict[str, Any], *, timeout_s: float) -> Any:
    """The read's result. Unlike a call, a read whose connection broke after it was sent is made
    once more: reading twice changes nothing."""
    try:
        return await upstream.call_tool(tool, args, timeout_s=timeout_s)
    except MCPError as exc:
        if not lost_after_sending(exc):
            raise
        log.warning("saga-mcp: the read %s lost its connection (%s); reading once more", tool, exc.message)
        return await upstream.call_tool(tool, args, timeout_s=timeout_s)


def describe_read(before: Mapping[str, Any], args: Any) -> str:
    """The read in words, for a message: ``inv.get_item {"id": 1} at 'item'``."""
    try:
        shown = json.dumps(fill_args(before.get("args", {}), args=args), default=str)[:200]
    except ImageError:
        shown = json.dumps(before.get("args", {}), default=str)[:200]
    path = before.get("path")
    return f"{before['tool']} {shown}" + (f" at '{path}'" if path else "")
