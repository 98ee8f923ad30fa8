"""ASGI middleware in front of ``saga-mcp --listen``: the bearer token every request needs when
``SAGA_MCP_TOKEN`` is set, and one open request per JSON-RPC id and session."""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio

log = logging.getLogger(__name__)

TOKEN_ENV = "SAGA_MCP_TOKEN"


class OneRequestPerId:
    """ASGI middleware: a POST that repeats the JSON-RPC id of a request still open in the same
    session waits until that request is answered, then goes on (and is answered from the record).

    The SDK's Streamable HTTP transport routes each response to the stream of the request with
    its id: two open requests with one id would share a slot, and one of them would never get
    its answer. Held here, the repeated request meets a finished call and gets its outcome."""

    def __init__(self, app: Any, *, wait_s: float) -> None:
        self.app, self.wait_s = app, wait_s
        self.open: dict[tuple[str, str], anyio.Event] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        session_id = dict(scope.get("headers") or []).get(b"mcp-session-id", b"")
        if scope["type"] != "http" or scope.get("method") != "POST" or not session_id:
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        keys = [(session_id.decode("latin-1"), each) for each in _request_ids(body)]
        if not await self._wait_for_earlier(keys, send):
            return
        mine = {key: anyio.Event() for key in keys}
        self.open.update(mine)
        replayed = False

        async def replay() -> Mapping[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: Mapping[str, Any] = await receive()
            return message

        try:
            await self.app(scope, replay, send)
        finally:
            for key, event in mine.items():
                if self.open.get(key) is event:
                    del self.open[key]
                event.set()

    async def _wait_for_earlier(self, keys: list[tuple[str, str]], send: Any) -> bool:
        """Wait until no open request holds any of ``keys``. False (after answering 409) when one
        still does at the deadline."""
        deadline = time.monotonic() + self.wait_s
        for key in keys:
            # A loop: a third request with the id may have taken the slot when the first freed it.
            while (earlier := self.open.get(key)) is not None:
                log.info("request id %s of session %s is still open: waiting for it", key[1], key[0][:8])
                with anyio.move_on_after(max(deadline - time.monotonic(), 0.0)):
                    await earlier.wait()
                if not earlier.is_set():
                    await _send_json(send, 409, "request_id_in_flight", f"Request id {key[1]} is still open.")
                    return False
        return True


async def _read_body(receive: Any) -> bytes:
    """The whole body of an HTTP request, read from the ASGI ``receive``."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _request_ids(body: bytes) -> list[str]:
    """The ids of the JSON-RPC requests in a POST body (one message or a batch), as text."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return []
    messages = parsed if isinstance(parsed, list) else [parsed]
    return [
        json.dumps(m["id"])
        for m in messages
        if isinstance(m, dict) and "method" in m and isinstance(m.get("id"), (str, int))
    ]


async def _send_json(
    send: Any, status: int, code: str, message: str, headers: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    body = json.dumps({"error": {"code": code, "message": message, "details": {}}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequireToken:
    """ASGI middleware in front of everything the listener serves: 401 unless the request carries
    ``Authorization: Bearer <SAGA_MCP_TOKEN>``, before the MCP layer reads it — so a request
    without the token can neither call a tool nor open, use or end a session."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = token.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = [value for name, value in scope.get("headers") or [] if name == b"authorization"]
            scheme, _, credentials = (given[0] if len(given) == 1 else b"").partition(b" ")
            # Constant time: how much of a guess matched must not show in how long the answer takes.
            matches = hmac.compare_digest(credentials.strip(), self.expected)
            if scheme.lower() != b"bearer" or not matches:
                await _send_json(
                    send,
                    401,
                    "unauthorized",
                    f"This saga-mcp listener needs `Authorization: Bearer <{TOKEN_ENV}>`.",
                    ((b"www-authenticate", b'Bearer realm="saga-mcp"'),),
                )
                return
        await self.app(scope, receive, send)
