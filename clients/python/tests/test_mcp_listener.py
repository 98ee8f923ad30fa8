"""saga-mcp's HTTP listener middlewares as plain ASGI apps: the bearer token every request needs
when SAGA_MCP_TOKEN is set, and one open request per JSON-RPC id and session."""

from __future__ import annotations

import json
from typing import Any

import pytest

anyio = pytest.importorskip("anyio")

from saga_client.mcp.listener import OneRequestPerId, RequireToken, _request_ids  # noqa: E402


class App:
    """An ASGI app that answers 200 with the body it read, optionally held until released."""

    def __init__(self, *, hold: bool = False) -> None:
        self.bodies: list[bytes] = []
        self.entered = anyio.Event()
        self.release = anyio.Event()
        self.hold = hold

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        self.bodies.append(message.get("body", b""))
        self.entered.set()
        if self.hold:
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: Any, *, method: str = "POST", headers: Any = (), body: bytes = b"") -> dict[str, Any]:
    """Send one HTTP request through ``app``; its status, headers and body."""
    sent: list[dict[str, Any]] = []
    chunks = [body[:3], body[3:]] if len(body) > 3 else [body]

    async def receive() -> dict[str, Any]:
        if chunks:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/mcp", "headers": list(headers)}
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {"status": start["status"], "headers": dict(start["headers"]), "body": body_out}


# --- The token -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"authorization", b"Bearer wrong")],
        [(b"authorization", b"Basic secret")],
        [(b"authorization", b"secret")],
        [(b"authorization", b"Bearer secret"), (b"authorization", b"Bearer secret")],
    ],
)
def test_a_request_without_the_right_bearer_token_is_401_before_the_mcp_layer(headers):
    app = App()
    answer = anyio.run(lambda: call(RequireToken(app, "secret"), headers=headers))
    assert answer["status"] == 401 and app.bodies == []
    assert answer["headers"][b"www-authenticate"] == b'Bearer realm="saga-mcp"'
    assert json.loads(answer["body"])["error"]["code"] == "unauthorized"


@pytest.mark.parametrize("value", [b"Bearer secret", b"bearer secret", b"Bearer  secret "])
def test_the_right_token_goes_through(value):
    app = App()
    answer = anyio.run(
        lambda: call(RequireToken(app, "secret"), headers=[(b"authorization", value)], body=b"{}")
    )
    assert answer["status"] == 200 and app.bodies == [b"{}"]


def test_what_is_not_http_is_not_asked_for_a_token():
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    anyio.run(lambda: RequireToken(app, "secret")({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


# --- One request per id ----------------------------------------------------------------------


def test_the_ids_of_a_post_are_those_of_its_requests_not_its_notifications_or_responses():
    assert _request_ids(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call"}') == ["7"]
    assert _request_ids(b'{"jsonrpc": "2.0", "id": "7", "method": "tools/call"}') == ['"7"']
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call"},
        {"jsonrpc": "2.0", "method": "notifications/progress"},
        {"jsonrpc": "2.0", "id": 2, "result": {}},
        {"jsonrpc": "2.0", "id": None, "method": "x"},
    ]
    assert _request_ids(json.dumps(batch).encode()) == ["1"]
    assert _request_ids(b"not json") == []


SESSION = [(b"mcp-session-id", b"s-1")]
BODY = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call"}'


def test_a_repeated_id_waits_for_the_open_request_then_goes_on_with_its_own_body():
    app = App(hold=True)
    guard = OneRequestPerId(app, wait_s=10)
    answers: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                answers.append(await call(guard, headers=SESSION, body=BODY))

            async def second() -> None:
                answers.append(await call(guard, headers=SESSION, body=BODY))

            tg.start_soon(first)
            await app.entered.wait()
            tg.start_soon(second)
            await anyio.sleep(0.1)
            assert len(app.bodies) == 1  # the repeat is held outside the MCP layer
            app.release.set()
        assert guard.open == {}

    anyio.run(scenario)
    assert [a["status"] for a in answers] == [200, 200]
    assert app.bodies == [BODY, BODY]  # the held request's body, read before waiting, replayed whole


def test_a_repeated_id_still_open_at_the_deadline_is_409():
    app = App(hold=True)
    guard = OneRequestPerId(app, wait_s=0.05)
    answers: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with anyio.create_task_group() as tg:

            async def first() -> None:
                answers.append(await call(guard, headers=SESSION, body=BODY))

            tg.start_soon(first)
            await app.entered.wait()
            answers.append(await call(guard, headers=SESSION, body=BODY))
            app.release.set()

    anyio.run(scenario)
    refused, done = answers
    assert refused["status"] == 409 and json.loads(refused["body"])["error"]["code"] == "request_id_in_flight"
    assert done["status"] == 200 and len(app.bodies) == 1


@pytest.mark.parametrize(
    "method, headers",
    [("GET", SESSION), ("DELETE", SESSION), ("POST", [])],
)
def test_other_requests_and_requests_outside_a_session_are_not_held(method, headers):
    app = App()
    guard = OneRequestPerId(app, wait_s=10)
    guard.open[("s-1", "7")] = anyio.Event()  # an open request with the id: ignored for these
    answer = anyio.run(lambda: call(guard, method=method, headers=headers, body=BODY))
    assert answer["status"] == 200


def test_the_same_id_in_another_session_is_not_held():
    app = App()
    guard = OneRequestPerId(app, wait_s=10)
    guard.open[("s-2", "7")] = anyio.Event()
    assert anyio.run(lambda: call(guard, headers=SESSION, body=BODY))["status"] == 200
