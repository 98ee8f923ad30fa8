"""Serving: reach the upstream (over Streamable HTTP, or a command started over stdio), open the
ledger client, and serve the gateway over stdio or at ``http://HOST:PORT/mcp`` behind the
listener's middlewares (``saga_client.mcp.listener``) until the client or a signal ends it."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings

from saga_client.aio import AsyncSaga
from saga_client.mcp.gateway import Gateway, describe_error
from saga_client.mcp.listener import TOKEN_ENV, OneRequestPerId, RequireToken
from saga_client.mcp.options import REPLAY_WAIT_MARGIN_S, GatewayError, Options, is_loopback
from saga_client.mcp.upstream import UpstreamLink
from saga_client.mcp.upstream import http_client as upstream_http_client


class _HttpTarget:
    """An HTTP upstream: its URL and the HTTP client to reach it with (``target_again``)."""

    def __init__(self, url: str, http_client: httpx2.AsyncClient | None) -> None:
        self.url, self.http_client = url, http_client


def upstream_target(
    upstream: str, environ: Mapping[str, str], http_client: httpx2.AsyncClient | None = None
) -> Any:
    """An HTTP upstream (reached over ``http_client`` when given), or the command line to start
    over stdio. The child gets the gateway's environment minus the Saga Admin key and the
    listener's token: the upstream has no business with either."""
    if is_url(upstream):
        return _HttpTarget(upstream, http_client)
    words = shlex.split(upstream)
    if not words:
        raise GatewayError(
            "saga-mcp: --upstream is empty: give an MCP server's URL or the command that starts it."
        )
    env = {key: value for key, value in environ.items() if key not in ("SAGA_API_KEY", TOKEN_ENV)}
    return StdioServerParameters(command=words[0], args=words[1:], env=env)


def is_url(upstream: str) -> bool:
    return upstream.startswith(("http://", "https://"))


def describe_upstream(upstream: str) -> str:
    """The upstream as it may appear in runs' metadata and messages (no credentials, no query)."""
    if upstream.startswith(("http://", "https://")):
        parts = urlsplit(upstream)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"
    words = shlex.split(upstream)
    return (
        os.path.basename(words[0]) + (" " + " ".join(words[1:2]) if len(words) > 1 else "") if words else ""
    )


class _SessionTracker:
    """ASGI middleware in front of the MCP endpoint: counts the requests each session has open
    (a session with an open stream is not idle) and ends a session's run when its client
    DELETEs the session."""

    def __init__(self, app: Any, gateway: Gateway) -> None:
        self.app, self.gateway = app, gateway

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session_id = dict(scope.get("headers") or []).get(b"mcp-session-id", b"").decode("latin-1")
        session = self.gateway.sessions.get(session_id) if session_id else None
        status: list[int] = []

        async def watch(message: Mapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        if session is not None:
            session.open_requests += 1
            session.touch()
        try:
            await self.app(scope, receive, watch)
        finally:
            if session is not None:
                session.open_requests -= 1
                session.touch()
        if session is not None and scope.get("method") == "DELETE" and status and status[0] < 300:
            await self.gateway.end_session(session, why="the client closed it")


async def serve(options: Options, environ: Mapping[str, str]) -> None:
    label = describe_upstream(options.upstream)
    gateway_ref: list[Gateway] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification) and gateway_ref:
            await gateway_ref[0].forward_list_changes()

    async with AsyncExitStack() as stack:
        http_client = None
        if is_url(options.upstream):
            # Our own HTTP client, so that a refused or broken connection is an answer the link
            # can act on rather than a crash of the SDK's transport (saga_client.mcp.upstream).
            headers = {name: environ[env] for name, env in options.upstream_headers}
            http_client = await stack.enter_async_context(upstream_http_client(headers or None))
        target = upstream_target(options.upstream, environ, http_client)
        upstream = UpstreamLink(
            lambda: Client(target_again(target), mode="legacy", message_handler=on_message, cache=None),
            label=label,
        )
        saga = await stack.enter_async_context(
            AsyncSaga(options.saga_url, options.api_key, retries=2, backoff_s=0.2, max_backoff_s=1.0)
        )
        refused: GatewayError | None = None
        async with anyio.create_task_group() as tg:
            try:
                # No deadline around opening: the client's task group must outlive the scope it
                # is entered in (anyio refuses otherwise). A dead upstream fails fast on its own.
                await upstream.start(tg)
                with anyio.fail_after(30):
                    await upstream.list_tools()
            except Exception as exc:  # noqa: BLE001 - whatever stops the upstream from answering, said once
                # Raised once the task group is done: from inside, it would come out wrapped in
                # an exception group rather than as the one sentence it is.
                refused = GatewayError(
                    f"saga-mcp: the upstream MCP server {label} did not answer ({describe_error(exc)}). "
                    "Check --upstream: nothing was started.",
                    status=1,
                )
                await upstream.close()
                tg.cancel_scope.cancel()
            else:
                await _serve_with(gateway_ref, options, upstream, saga, label, tg)
        if refused is not None:
            raise refused


async def _serve_with(
    gateway_ref: list[Gateway],
    options: Options,
    upstream: UpstreamLink,
    saga: AsyncSaga,
    label: str,
    tg: anyio.abc.TaskGroup,
) -> None:
    gateway = Gateway(options, upstream, saga, upstream_label=label)
    gateway_ref.append(gateway)
    gateway.run_with(tg)
    tg.start_soon(gateway.reap_idle)
    try:
        if options.listen is None:
            await _serve_stdio(gateway)
        else:
            await _serve_http(gateway, *options.listen)
    finally:
        await gateway.end_all(why="the gateway stopped" if options.listen else "the client disconnected")
        await upstream.close()
        tg.cancel_scope.cancel()


def target_again(target: Any) -> Any:
    """``target`` for one more ``Client``: a Streamable HTTP transport is made per connection
    (``streamable_http_client`` is a one-shot context manager), the rest are reusable."""
    if isinstance(target, _HttpTarget):
        return streamable_http_client(target.url, http_client=target.http_client)
    return target


async def _serve_stdio(gateway: Gateway) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await gateway.server.run(read_stream, write_stream, gateway.server.create_initialization_options())


# The names a loopback listener answers to (what the MCP SDK's own protection allows), in Host
# header form, besides the address it listens on.
_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def transport_security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection for a listener on any loopback address ``is_loopback`` accepts
    (the rule that lets it run without a token): only requests whose Host names this machine, and
    whose Origin, if any, is this machine, are served (421 / 403 otherwise). The SDK turns it on
    only for the literals 127.0.0.1, localhost and ::1, so ``--listen 127.0.0.2:…`` or
    ``LOCALHOST`` once ran tokenless and open to a web page whose name had been rebound to that
    address. Beyond loopback, None: the token guards it (``options_from``
    refuses such a listener without one)."""
    if not is_loopback(host):
        return None
    own = f"[{host}]" if ":" in host else host.lower()
    names = dict.fromkeys((own, *_LOOPBACK_NAMES))
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{name}:*" for name in names],
        allowed_origins=[f"http://{name}:*" for name in names],
    )


async def _serve_http(gateway: Gateway, host: str, port: int) -> None:
    import uvicorn

    options = gateway.options
    app: Any = _SessionTracker(
        OneRequestPerId(
            gateway.server.streamable_http_app(
                host=host,
                session_idle_timeout=options.idle_timeout_s,
                transport_security=transport_security(host),
            ),
            wait_s=options.approval_timeout_s + options.call_timeout_s + REPLAY_WAIT_MARGIN_S,
        ),
        gateway,
    )
    if gateway.options.token:
        app = RequireToken(app, gateway.options.token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    print(f"saga-mcp: serving MCP at http://{host}:{port}/mcp", file=sys.stderr, flush=True)
    await server.serve()
