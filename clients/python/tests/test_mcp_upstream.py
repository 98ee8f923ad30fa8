"""How the gateway tells a call the upstream never accepted (safe to send once more) from one that
may have run (never sent again): the errors the SDK's client raises, and the refusals its HTTP
client answers instead of crashing the SDK's transport (``saga_client.mcp.upstream``). The
restarted upstream itself is in tests/client/test_mcp_upstream_restart.py."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mcp")

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import MCPError  # noqa: E402

from saga_client.mcp.upstream import (  # noqa: E402
    CONNECTION_LOST,
    NOT_CONNECTED,
    _Refusals,
    lost_after_sending,
    not_reached_reason,
)


class Raising(httpx2.AsyncBaseTransport):
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        raise self.error


def answer(error: Exception) -> httpx2.Response:
    async def send() -> httpx2.Response:
        return await _Refusals(Raising(error)).handle_async_request(httpx2.Request("POST", "http://hr/mcp"))

    return anyio.run(send)


@pytest.mark.parametrize(
    "error, safe",
    [
        (MCPError(-32600, "Session not found"), True),  # the upstream restarted: it never saw the call
        (MCPError(-32600, "Session terminated"), True),  # the SDK's words for a bare 404
        (MCPError(NOT_CONNECTED, "the upstream refused the connection"), True),
        (MCPError(CONNECTION_LOST, "the connection to the upstream broke"), False),
        (MCPError(-32000, "SSE stream ended without a response"), False),
        (MCPError(-32602, "Unknown tool"), False),
        (TimeoutError(), False),
    ],
)
def test_only_a_request_the_upstream_did_not_accept_is_safe_to_send_again(error, safe):
    assert (not_reached_reason(error) is not None) is safe


def test_a_connection_lost_after_sending_is_told_apart_from_an_upstream_error():
    assert lost_after_sending(MCPError(CONNECTION_LOST, "broke"))
    assert lost_after_sending(MCPError(-32000, "SSE stream ended without a response"))
    assert lost_after_sending(MCPError(-32000, "Connection closed"))
    assert not lost_after_sending(MCPError(-32602, "Unknown tool"))
    assert not lost_after_sending(MCPError(-32600, "Session not found"))


def test_a_refused_connection_is_answered_as_not_connected():
    refused = answer(httpx2.ConnectError("All connection attempts failed"))
    assert refused.status_code == 503
    error = json.loads(refused.content)["error"]
    assert error["code"] == NOT_CONNECTED and "refused the connection" in error["message"]


def test_a_connection_that_broke_after_sending_is_answered_as_lost():
    lost = answer(httpx2.RemoteProtocolError("Server disconnected without sending a response."))
    assert json.loads(lost.content)["error"]["code"] == CONNECTION_LOST


def test_a_time_out_before_connecting_was_not_sent_and_one_after_may_have_run():
    assert json.loads(answer(httpx2.ConnectTimeout("timed out")).content)["error"]["code"] == NOT_CONNECTED
    assert json.loads(answer(httpx2.ReadTimeout("timed out")).content)["error"]["code"] == CONNECTION_LOST
