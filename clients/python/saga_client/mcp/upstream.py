"""The gateway's session with its upstream MCP server, opened again when the upstream loses it.

An upstream that restarts forgets its sessions: every request on the old one is answered 404
"Session not found". While it is down, connecting is refused. Both answers mean the request was
not accepted, so nothing ran: ``UpstreamLink`` says so with ``NotReached``, opens a new session
(initialize again, with a bounded backoff) and the gateway sends the call once more. Any other
failure (a time-out, a connection lost after the request went out) may have happened upstream and
is never sent again.

The SDK's Streamable HTTP transport treats a refused connection as a crash of its task group,
which would take the gateway with it: ``_Refusals`` turns it, and a connection lost mid-request,
into a JSON-RPC error reply the SDK hands to the caller, each with a code of ours saying which.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import Client, MCPError

log = logging.getLogger(__name__)

# JSON-RPC error codes of ours (the implementation-defined range), set by ``_Refusals``.
NOT_CONNECTED = -32090  # the connection was refused: the request was never sent
CONNECTION_LOST = -32091  # the connection broke after the request was sent: it may have run
# What an upstream (the SDK's server), or the SDK's client for a bare 404, answers a request
# made on a session it does not know.
_SESSION_LOST = frozenset({"Session not found", "Session terminated"})
# The waits between attempts to open a new session (about 8 s in all), then the call is not made.
RECONNECT_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)


class NotReached(Exception):
    """The upstream did not accept the request (its session is gone, or it refused the
    connection): the call did not run there and may be sent again."""

    def __init__(self, reason: str, generation: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.generation = generation


def not_reached_reason(exc: BaseException) -> str | None:
    """Why ``exc`` says the upstream did not accept the request, or None when it may have."""
    if isinstance(exc, MCPError):
        if exc.code == NOT_CONNECTED:
            return exc.message
        if exc.message in _SESSION_LOST:
            return f"the upstream answered {exc.message!r} (it restarted, or ended the session)"
    return None


def lost_after_sending(exc: BaseException) -> bool:
    """Whether ``exc`` says the request went out and the connection broke before its answer (it
    may have run upstream): ours from ``_Refusals``, or the SDK's for an answer stream cut short
    ("SSE stream ended without a response", "Connection closed", …)."""
    if not isinstance(exc, MCPError):
        return False
    return exc.code == CONNECTION_LOST or exc.message.startswith(("SSE stream", "Connection closed"))


class _Refusals(httpx2.AsyncBaseTransport):
    """Around the HTTP transport to the upstream: a refused connection, or one lost (or timed
    out) mid-request, is answered as a JSON-RPC error (``NOT_CONNECTED`` / ``CONNECTION_LOST``)
    instead of raised."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            return await self.inner.handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            # No connection, so nothing was sent.
            code, what = NOT_CONNECTED, f"the upstream refused the connection ({_describe(exc)})"
        except httpx2.TransportError as exc:
            code, what = (
                CONNECTION_LOST,
                f"the connection to the upstream broke ({type(exc).__name__}: {exc})",
            )
        body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": what}}
        return httpx2.Response(503, json=body, request=request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def http_client(headers: dict[str, str] | None = None) -> httpx2.AsyncClient:
    """The HTTP client the gateway reaches an HTTP upstream with: the SDK's default time-outs,
    ``headers`` on every request, refusals answered (``_Refusals``)."""
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        transport=_Refusals(httpx2.AsyncHTTPTransport()),
    )


class UpstreamLink:
    """The upstream session the gateway forwards on: ``open_client`` makes a (not yet entered)
    ``mcp.Client``, held open in a task of its own so that it can be replaced from any request."""

    def __init__(
        self,
        open_client: Callable[[], Client],
        *,
        label: str,
        backoff_s: tuple[float, ...] = RECONNECT_BACKOFF_S,
    ) -> None:
        self.open_client = open_client
        self.label = label
        self.backoff_s = backoff_s
        self.generation = 0
        self.reconnects = 0
        self._client: Client | None = None
        self._close: anyio.Event | None = None
        self._lock = anyio.Lock()
        self._task_group: anyio.abc.TaskGroup | None = None

    @property
    def instructions(self) -> str | None:
        return self._client.instructions if self._client is not None else None

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Open the first session (raising what stopped it: the gateway does not start)."""
        self._task_group = task_group
        await self._open()

    async def close(self) -> None:
        if self._close is not None:
            self._close.set()
        self._client = None

    async def _open(self) -> None:
        assert self._task_group is not None
        client, close = self.open_client(), anyio.Event()

        async def hold(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            started = False
            try:
                async with client:
                    started = True
                    task_status.started()
                    await close.wait()
            except Exception as exc:  # noqa: BLE001 - a session that broke is replaced, not fatal
                if not started:
                    raise
                log.warning("saga-mcp: the upstream session of %s broke: %s", self.label, _describe(exc))
            finally:
                if self._client is client:
                    # Broke, not replaced: the next request finds no session and opens one.
                    self._client = None

        await self._task_group.start(hold)
        previous = self._close
        self._client, self._close = client, close
        self.generation += 1
        if previous is not None:
            previous.set()

    async def reconnect(self, lost: NotReached, *, doing: str) -> None:
        """Open a new session after ``lost`` (unless another request already did), trying
        ``backoff_s`` times; ``NotReached`` when the upstream still cannot be reached."""
        async with self._lock:
            if self.generation != lost.generation:
                return
            log.warning(
                "saga-mcp: lost the upstream session (event=upstream_session_lost upstream=%s reason=%r "
                "during=%s); opening a new one",
                self.label,
                lost.reason,
                doing,
                extra={"event": "upstream_session_lost", "upstream": self.label, "reason": lost.reason},
            )
            last = lost.reason
            for wait in self.backoff_s:
                await anyio.sleep(wait)
                try:
                    await self._open()
                except Exception as exc:  # noqa: BLE001 - down still: wait and try again
                    last = _describe(exc)
                    continue
                self.reconnects += 1
                log.warning(
                    "saga-mcp: opened a new upstream session (event=upstream_reconnected upstream=%s)",
                    self.label,
                    extra={"event": "upstream_reconnected", "upstream": self.label},
                )
                return
            raise NotReached(
                f"{lost.reason}; a new session could not be opened in {len(self.backoff_s)} attempts "
                f"over {sum(self.backoff_s):g} s ({last})",
                self.generation,
            )

    async def _attempt(self, send: Callable[[Client], Any]) -> Any:
        client, generation = self._client, self.generation
        if client is None:
            raise NotReached("the gateway has no upstream session", generation)
        try:
            return await send(client)
        except MCPError as exc:
            reason = not_reached_reason(exc)
            if reason is None:
                raise
            raise NotReached(reason, generation) from exc

    async def call_tool(
        self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None
    ) -> types.CallToolResult:
        """Call ``name`` on the upstream. When the upstream did not accept it (``NotReached``):
        a new session, and the call sent once more; ``NotReached`` again means it was not made.
        ``timeout_s`` bounds each send, not the reconnecting between them."""

        async def send(client: Client) -> types.CallToolResult:
            with anyio.fail_after(timeout_s) if timeout_s is not None else _no_deadline():
                return await client.call_tool(name, arguments)

        try:
            result: types.CallToolResult = await self._attempt(send)
        except NotReached as lost:
            await self.reconnect(lost, doing=f"tools/call {name}")
            result = await self._attempt(send)
        return result

    async def list_tools(self, cursor: str | None = None) -> types.ListToolsResult:
        """The upstream's tools (listing is harmless: after a lost session, asked again once)."""

        async def send(client: Client) -> types.ListToolsResult:
            return await client.list_tools(cursor=cursor, cache_mode="bypass")

        try:
            listed: types.ListToolsResult = await self._attempt(send)
        except NotReached as lost:
            await self.reconnect(lost, doing="tools/list")
            listed = await self._attempt(send)
        return listed

    async def ensure_reachable(self) -> None:
        """Ping the upstream, opening a new session when it lost ours: done before an approved
        call is started, so that its approval is not spent on an upstream that cannot take it.
        ``NotReached`` when it still cannot be reached."""

        async def send(client: Client) -> Any:
            with anyio.fail_after(10):
                return await client.send_ping()

        try:
            await self._attempt(send)
        except NotReached as lost:
            await self.reconnect(lost, doing="ping")
            await self._attempt(send)


class _no_deadline:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, tuple):
        return "; ".join(_describe(each) for each in inner)
    if isinstance(exc, MCPError):
        return f"{exc.message} (JSON-RPC {exc.code})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
