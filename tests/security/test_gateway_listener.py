"""The gateway's listener is not open: ``saga-mcp --listen`` acts with its agent key, so beyond
loopback it refuses to start without ``SAGA_MCP_TOKEN``, and with the token set every HTTP
request must carry it. The gateway and its upstream are real processes; the MCP client is the
SDK's own over Streamable HTTP."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.mcp_servers import gateway_command, gateway_env, http_gateway, http_upstream
from tests.support.processes import free_port

pytestmark = pytest.mark.timeout(120)

TOKEN = "gateway-listener-token-for-tests"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}


@pytest.mark.parametrize("host", ["0.0.0.0", "gateway.internal"])
def test_it_refuses_to_listen_beyond_loopback_without_a_token(host, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        gateway_command(dead, f"{dead}/mcp", "--listen", f"{host}:{free_port()}"),
        env=gateway_env(tmp_path / "journal.jsonl", "sk_test_key"),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert b"SAGA_MCP_TOKEN" in done.stderr, done.stderr
    # Refused before anything started: the upstream was never even tried.
    assert b"did not answer" not in done.stderr


def test_with_a_token_every_http_request_must_carry_it(tmp_path: Path):
    with (
        http_upstream(tmp_path) as upstream,
        http_gateway(
            f"http://127.0.0.1:{free_port()}",
            upstream.url,
            "sk_test_key",
            tmp_path,
            env={"SAGA_MCP_TOKEN": TOKEN},
        ) as url,
    ):
        accept = {"Accept": "application/json, text/event-stream"}
        refused = [
            httpx.post(url, json=INITIALIZE, headers=accept, timeout=10),
            httpx.post(
                url, json=INITIALIZE, headers={**accept, "Authorization": "Bearer not-the-token"}, timeout=10
            ),
            httpx.post(url, json=INITIALIZE, headers={**accept, "Authorization": TOKEN}, timeout=10),
            httpx.get(url, headers=accept, timeout=10),
            httpx.delete(url, headers={"Mcp-Session-Id": "any"}, timeout=10),
        ]
        for response in refused:
            assert response.status_code == 401, (response.request.method, response.text)
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert "mcp-session-id" not in response.headers

        async def list_tools(token: str) -> list[str]:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
            ):
                return [tool.name for tool in (await client.list_tools()).tools]

        assert "create_user" in asyncio.run(list_tools(TOKEN))
        assert upstream.tools_called() == []


@pytest.mark.parametrize("host", ["127.0.0.2", "127.0.0.1"])
def test_a_tokenless_loopback_listener_refuses_a_rebound_name(host, tmp_path: Path):
    """The DNS-rebinding attack: a web page on attacker.example whose name was
    rebound to the gateway's loopback address makes the browser send requests there with
    ``Host: attacker.example:<port>`` (and that Origin). ``is_loopback`` lets 127.0.0.2 run without
    a token, so it must be protected like 127.0.0.1, which the MCP SDK alone covers."""
    with (
        http_upstream(tmp_path) as upstream,
        http_gateway(
            f"http://127.0.0.1:{free_port()}", upstream.url, "sk_test_key", tmp_path, host=host
        ) as url,
    ):
        port = url.rsplit(":", 1)[1].split("/")[0]
        accept = {"Accept": "application/json, text/event-stream"}
        rebound = httpx.post(
            url, json=INITIALIZE, headers={**accept, "Host": f"attacker.example:{port}"}, timeout=10
        )
        assert rebound.status_code == 421, rebound.text
        cross_origin = httpx.post(
            url, json=INITIALIZE, headers={**accept, "Origin": f"http://attacker.example:{port}"}, timeout=10
        )
        assert cross_origin.status_code == 403, cross_origin.text
        assert "mcp-session-id" not in rebound.headers and "mcp-session-id" not in cross_origin.headers

        async def list_tools() -> list[str]:
            async with (
                httpx2.AsyncClient() as http,
                Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
            ):
                return [tool.name for tool in (await client.list_tools()).tools]

        # The gateway's own clients, naming the address they connect to, are served.
        assert "create_user" in asyncio.run(list_tools())
        assert upstream.tools_called() == []
