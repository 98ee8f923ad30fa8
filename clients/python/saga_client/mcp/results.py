"""What ``saga-mcp`` records of a successful MCP call, and the same MCP result rebuilt from that
record: how a repeated request is answered with the first call's result, content and all, by any
gateway process."""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from saga_client.errors import Paused, PolicyDenied, RunArchived, SagaAPIError, SagaError, SagaUnavailable
from saga_client.images import ImageError, read_result

# The member of a recorded result that keeps what the ledger's ``result`` does not already say of
# the MCP result (its content blocks, its ``_meta``), so that a replay answers with the same result.
MCP_RESULT = "saga/mcp"
# The members of every result's ``_meta`` that name its run and action (``_meta["saga/run"]``
# brought back attaches a stateless client's next call to the same run).
RUN_META = "saga/run"
ACTION_META = "saga/action"


def result_text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


def recorded_result(result: types.CallToolResult) -> Any:
    """What the ledger keeps as a successful call's ``result``: its ``structuredContent`` (so that
    ``$result.<path>`` in a policy's compensation finds its members), else its single text block's
    JSON object when that text is one, or its text; plus, under
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
    texts = [block for block in result.content if isinstance(block, types.TextContent)]
    if structured is None and len(texts) == 1:
        # One text block that is a JSON object (a server returning JSON as text): recorded as that
        # object, so that ``$result.<path>`` finds its members as it would in structured content
        # (the images' rule, ``saga_client.images.read_result``). A replay answers with the text.
        try:
            parsed = read_result(texts=[texts[0].text])
        except ImageError:
            parsed = None
        if isinstance(parsed, dict) and MCP_RESULT not in parsed:
            return {**parsed, MCP_RESULT: envelope}
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


def tool_error(message: str, *, run_id: str = "", action_id: str = "") -> types.CallToolResult:
    meta: dict[str, Any] = {}
    if run_id:
        meta[RUN_META] = run_id
    if action_id:
        meta[ACTION_META] = action_id
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True, _meta=meta or None
    )


def with_meta(result: types.CallToolResult, *, run_id: str, action_id: str) -> types.CallToolResult:
    meta = dict(result.meta or {})
    meta[RUN_META] = run_id
    meta[ACTION_META] = action_id
    return result.model_copy(update={"meta": meta})


def refusal(exc: SagaError) -> str:
    """The tool error for a call Saga Admin refused or could not record: why, and that the
    upstream was not called."""
    if isinstance(exc, SagaUnavailable):
        return (
            "Saga Admin could not be reached to record this call, so it was not made (calls are only "
            f"forwarded once recorded). {exc.message}"
        )
    if isinstance(exc, Paused):
        return f"Paused in Saga Admin, so the call was not made: {exc.message}"
    if isinstance(exc, PolicyDenied):
        return f"Denied by a Saga Admin policy, so the call was not made: {exc.message}"
    if isinstance(exc, RunArchived):
        return (
            f"This run was archived in Saga Admin ({exc.archived_at}; archive {exc.archive}) and takes no "
            "more calls, so the call was not made. Start a new session (or, stateless, leave "
            f'_meta["{RUN_META}"] out) for a new run.'
        )
    if isinstance(exc, SagaAPIError):
        return f"Saga Admin refused to record this call ({exc.code}), so it was not made: {exc.message}"
    return f"Saga Admin could not record this call, so it was not made: {exc}"
