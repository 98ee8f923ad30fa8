"""A small inventory MCP server (the SDK's ``MCPServer`` over Streamable HTTP) for the gateway's
before-image tests: ``get_item`` reads an item, ``set_price`` updates its price. Its state is a
JSON file, so that it survives a restart of the process (an upstream that restarted), and every
call that reaches a tool is journalled.

    python mcp_inventory_upstream.py HOST:PORT STATE JOURNAL structured|text

``structured``: the tools answer with structured content (and the SDK's text of it); ``text``:
with one text block of JSON and no structured content, as many servers do. ``get_item`` of
``broken`` is a tool error; of ``ghost``, a result without ``item`` (no value at the path); of
``fragile`` just after its price was set, a tool error (an after-read that fails).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

HOST_PORT, STATE, JOURNAL, MODE = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
STRUCTURED = MODE == "structured"

mcp = MCPServer("inventory", version="1.0.0")


def _journal(tool: str, args: dict[str, Any]) -> None:
    with JOURNAL.open("a", encoding="utf-8") as journal:
        journal.write(json.dumps({"tool": tool, "args": args}) + "\n")


def _items() -> dict[str, Any]:
    items: dict[str, Any] = json.loads(STATE.read_text())
    return items


def _answer(value: dict[str, Any]) -> Any:
    return value if STRUCTURED else json.dumps(value)


def _get_item(id: str) -> Any:
    _journal("get_item", {"id": id})
    if id == "broken":
        raise ToolError("the inventory database is unavailable")
    if id == "ghost":
        return _answer({"found": False})
    items = _items()
    if id not in items:
        raise ToolError(f"no item {id}")
    if items[id].pop("reads_fail", False):
        raise ToolError(f"item {id} cannot be read just now")
    return _answer({"item": {"id": id, **items[id]}})


def _set_price(id: str, price: float) -> Any:
    _journal("set_price", {"id": id, "price": price})
    items = _items()
    items.setdefault(id, {"name": id, "price": None})["price"] = price
    if id == "fragile":
        items[id]["reads_fail"] = True  # the next read of it fails (an after-read that fails)
    STATE.write_text(json.dumps(items))
    return _answer({"id": id, "price": price})


if STRUCTURED:

    @mcp.tool(name="get_item")
    def get_item_structured(id: str) -> dict[str, Any]:
        """An item of the inventory: its name and price."""
        result: dict[str, Any] = _get_item(id)
        return result

    @mcp.tool(name="set_price")
    def set_price_structured(id: str, price: float) -> dict[str, Any]:
        """Set an item's price."""
        result: dict[str, Any] = _set_price(id, price)
        return result

else:

    @mcp.tool(name="get_item", structured_output=False)
    def get_item_text(id: str) -> str:
        """An item of the inventory, as JSON text."""
        result: str = _get_item(id)
        return result

    @mcp.tool(name="set_price", structured_output=False)
    def set_price_text(id: str, price: float) -> str:
        """Set an item's price (answered as JSON text)."""
        result: str = _set_price(id, price)
        return result


if __name__ == "__main__":
    host, _, port = HOST_PORT.rpartition(":")
    uvicorn.run(mcp.streamable_http_app(host=host), host=host, port=int(port), log_level="warning")
