"""The MCP cases run against a compensating tool on an MCP server (Streamable HTTP): the server
answers, the tool is listed, the compensation args fit its input schema, and a call with them
succeeds (a result with ``isError`` is reported with its text). Needs the ``mcp`` extra."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from saga_client.compensator_check.cases import ERROR, FAIL, PASS, Spec
from saga_client.compensator_check.webhook import Result


@dataclass
class McpTarget:
    url: str
    tool: str
    args: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0


def _text(result: Any) -> str:
    parts = [getattr(item, "text", "") for item in getattr(result, "content", []) or []]
    return " ".join(part for part in parts if part).strip()


async def _exchange(
    client: Any, target: McpTarget, harmless_only: bool, add: Callable[[str, str, str], None]
) -> None:
    """The cases after the server answered: the tool is listed, the args fit, the call succeeds."""
    import jsonschema

    listed = await client.list_tools()
    tool = next((t for t in listed.tools if t.name == target.tool), None)
    if tool is None:
        names = ", ".join(sorted(t.name for t in listed.tools)) or "none"
        add("mcp_tool_exists", FAIL, f"{target.tool} is not listed (tools: {names})")
        return
    add("mcp_tool_exists", PASS, "")
    try:
        jsonschema.validate(target.args, tool.input_schema)
    except jsonschema.ValidationError as exc:
        add("mcp_args_match_schema", FAIL, f"the args do not fit: {exc.message}")
    except jsonschema.SchemaError as exc:
        add("mcp_args_match_schema", FAIL, f"the tool's input schema is not valid JSON Schema: {exc.message}")
    else:
        add("mcp_args_match_schema", PASS, "")
    if harmless_only:
        return
    result = await client.call_tool(target.tool, target.args)
    if result.is_error:
        add("mcp_call_succeeds", FAIL, f"isError: {_text(result) or '(no message)'}")
    else:
        add("mcp_call_succeeds", PASS, _text(result)[:160])


async def _run(target: McpTarget, spec: Spec, harmless_only: bool) -> list[Result]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    cases = {case.id: case for case in spec.mcp}
    results: list[Result] = []

    def add(case_id: str, verdict: str, detail: str) -> None:
        results.append(Result(cases[case_id], verdict, detail))

    try:
        async with httpx2.AsyncClient(
            headers=target.headers, timeout=httpx2.Timeout(target.timeout_s)
        ) as http:
            transport = streamable_http_client(target.url, http_client=http)
            async with Client(transport, read_timeout_seconds=target.timeout_s, cache=None) as client:
                add("mcp_reachable", PASS, "")
                await _exchange(client, target, harmless_only, add)
    except Exception as exc:  # noqa: BLE001 - any failure to talk to the server is the verdict
        leaves = getattr(exc, "exceptions", None)
        cause = leaves[0] if leaves else exc
        # The case in progress failed with this error; the ones after it were not run.
        done = {result.case.id for result in results}
        first = True
        for case in spec.mcp:
            if case.id in done or (harmless_only and not case.harmless):
                continue
            detail = f"{type(cause).__name__}: {cause}" if first else "not run"
            results.append(Result(case, FAIL if first else ERROR, detail))
            first = False
    return results


def run_mcp(target: McpTarget, spec: Spec, *, harmless_only: bool = False) -> list[Result]:
    return asyncio.run(_run(target, spec, harmless_only))


def args_from(text: str | None) -> dict[str, Any]:
    """``--args``: a JSON object, inline or ``@FILE``."""
    if not text:
        return {}
    raw = open(text[1:], encoding="utf-8").read() if text.startswith("@") else text  # noqa: SIM115
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("--args must be a JSON object")
    return value
