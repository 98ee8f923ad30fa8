"""What ``saga-mcp`` records of a successful MCP call, and the same MCP result rebuilt from that
record: how a repeated request is answered with the first call's result, content and all, by any
gateway process."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from pydantic import ValidationError

# The member of a recorded result that keeps what the ledger's ``result`` does not already say of
# the MCP result (its content blocks, its ``_meta``), so that a replay answers with the same result.
MCP_RESULT = "saga/mcp"


def result_text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def recorded_result(result: types.CallToolResult) -> Any:
    """What the ledger keeps as a successful call's ``result``: its ``structuredContent`` (so that
    ``$result.<path>`` in a policy's compensation finds its members), or its text; plus, under
    ``"saga/mcp"``, whatever else the MCP result said (its content blocks, its ``_meta``). A
    repeated request — in this process or another — is answered from this record with the same
    result, content and all (``result_from_record``)."""
    envelope: dict[str, Any] = {
        "content": [
            block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content
        ]
    }
    if result.meta:
        envelope["_meta"] = dict(result.meta)
    structured = result.structured_content
    if isinstance(structured, dict) and MCP_RESULT not in structured:
        return {**structured, MCP_RESULT: {**envelope, "structured": True}}
    text = result_text(result)
    if structured is None and envelope == {"content": [{"type": "text", "text": text}]}:
        return text  # one plain text block: the text says it all
    if structured is not None:
        envelope["structuredContent"] = structured
    return {"text": text, MCP_RESULT: envelope}


def result_from_record(recorded: Any) -> types.CallToolResult:
    """The MCP result a successful call returned, from what ``recorded_result`` kept (or, for a
    result recorded some other way, the closest one: its text, or its JSON)."""
    envelope = recorded.get(MCP_RESULT) if isinstance(recorded, dict) else None
    if isinstance(envelope, dict):
        data: dict[str, Any] = {"content": envelope.get("content", [])}
        if envelope.get("structured") is True:
            data["structuredContent"] = {k: v for k, v in recorded.items() if k != MCP_RESULT}
        elif "structuredContent" in envelope:
            data["structuredContent"] = envelope["structuredContent"]
        if "_meta" in envelope:
            data["_meta"] = envelope["_meta"]
        try:
            return types.CallToolResult.model_validate(data)
        except ValidationError:
            # The record was not written by a gateway (the agent key may write any result):
            # answer with what it says as text rather than fail.
            pass
    if isinstance(recorded, str):
        return types.CallToolResult(content=[types.TextContent(type="text", text=recorded)])
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(recorded, default=str))],
        structured_content=recorded if isinstance(recorded, dict) else None,
    )
