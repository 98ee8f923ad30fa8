"""The rule a run ends by when its agent carried on past a failed call: a call that failed and
was not later retried successfully with the same arguments fails the run, so it lands in the
recovery queue. ``saga-mcp`` ends a session by it; the adapters (LangGraph, OpenAI Agents), whose
frameworks turn a tool's exception into a message for the model and go on, end their runs by it.
The TypeScript client has the same rule in ``src/failures.ts``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _key(tool: str, args: Mapping[str, Any] | None) -> str:
    return json.dumps([tool, dict(args or {})], sort_keys=True, separators=(",", ":"), default=str)


class UnretriedFailures:
    """The calls that failed and were not since retried successfully, by (tool, arguments)."""

    def __init__(self) -> None:
        self._failed: dict[str, tuple[str, str]] = {}

    def failed(self, tool: str, args: Mapping[str, Any] | None, action_id: str, message: str) -> None:
        self._failed.pop(_key(tool, args), None)  # the latest failure is the last one named
        self._failed[_key(tool, args)] = (action_id, message)

    def succeeded(self, tool: str, args: Mapping[str, Any] | None) -> None:
        self._failed.pop(_key(tool, args), None)

    def __bool__(self) -> bool:
        return bool(self._failed)

    def __len__(self) -> int:
        return len(self._failed)

    def verdict(self, ended: str) -> tuple[str, str] | None:
        """None when the run may complete; else the failure report (``ended``: what ended it,
        e.g. "The MCP session ended (the client closed it)") and the last such call's action."""
        if not self._failed:
            return None
        action_id, message = list(self._failed.values())[-1]
        report = (
            f"{ended} after {len(self._failed)} failed call(s) that were not retried successfully "
            f"with the same arguments; the last: {message}"
        )
        return report[:20000], action_id
