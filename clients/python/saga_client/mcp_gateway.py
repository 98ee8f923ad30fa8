"""``saga-mcp``: a Model Context Protocol gateway that records every tool call in Saga Admin.

Put it between an agent and its MCP server and the agent gets a ledger, approvals and undo
without a code change::

    SAGA_API_KEY=sk_… saga-mcp --saga-url https://saga.example.com --upstream https://hr.internal/mcp

The gateway offers the upstream's tools unchanged (names, schemas, descriptions) and forwards
their list changes. Each MCP session is one run; each ``tools/call`` is a step of it: recorded
(``NS.name`` with the call's arguments and a key derived from the session and the request id),
started, forwarded, and recorded ``succeeded`` or ``failed`` — or ``unknown`` when the upstream
timed out and the call may have happened. A pause or a denying policy rule becomes a tool error
that says why, and the upstream is never called; a call that needs approval waits for a person
(reporting progress when the client asked for it). Saga Admin unreachable → the call is refused:
nothing is forwarded that is not recorded.

One approval, one call: only the request that moved its action to ``running`` forwards it. A
request sent again with the same JSON-RPC id, or any replay of an action already started, is
answered with the first call's outcome (read back from the ledger, waiting while it still runs),
never forwarded a second time.

Sessions: over stdio, the process is the session; over Streamable HTTP, an ``initialize``
handshake opens one (``Mcp-Session-Id``) and a ``DELETE``, an idle time-out or the gateway's
shutdown ends it. A client on the stateless 2026 protocol has no session: each call starts a run
unless its ``_meta["saga/run"]`` names one this gateway gave it (every result carries its run
in ``_meta["saga/run"]``). When a session ends, its run fails (into the recovery queue) if a
call failed and was not retried successfully since, and completes otherwise.

The key comes from ``SAGA_API_KEY`` only: a key on a command line is readable by every user of
the machine (``ps``). Whoever reaches ``--listen`` acts with that key, so a listener beyond
loopback needs ``SAGA_MCP_TOKEN``, which every HTTP request must then carry as a bearer token.
Nothing here imports the server: this is the client distribution.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import shlex
import sys
import time
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.stdio import stdio_server
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from ._core import DONE_STATES
from ._mcp_listener import TOKEN_ENV, OneRequestPerId, RequireToken
from ._mcp_results import recorded_result, result_from_record
from ._mcp_results import result_text as _result_text
from .aio import AsyncSaga
from .errors import Paused, PolicyDenied, SagaAPIError, SagaError, SagaUnavailable
from .responses import ActionDict

log = logging.getLogger("saga_client.mcp")

DEFAULT_AGENT = "mcp"
DEFAULT_APPROVAL_TIMEOUT_S = 300.0
DEFAULT_CALL_TIMEOUT_S = 120.0
DEFAULT_IDLE_TIMEOUT_S = 1800.0
DEFAULT_HEARTBEAT_S = 30.0
RUN_META = "saga/run"
ACTION_META = "saga/action"
# How long, beyond the call time-out, a repeated request waits for the first one's outcome.
REPLAY_WAIT_MARGIN_S = 30.0


class GatewayError(Exception):
    """A configuration or startup problem: printed as one sentence, exit status 2 (or 1)."""

    def __init__(self, message: str, *, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


# --- Configuration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    saga_url: str
    api_key: str
    upstream: str
    agent: str = DEFAULT_AGENT
    namespace: str = ""
    listen: tuple[str, int] | None = None
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    upstream_headers: tuple[tuple[str, str], ...] = ()
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    poll_interval_s: float = 1.0
    # The bearer token every HTTP request must carry (``SAGA_MCP_TOKEN``); empty: no token asked.
    token: str = field(default="", repr=False)

    def recorded_name(self, tool: str) -> str:
        return f"{self.namespace}.{tool}" if self.namespace else tool


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT (e.g. 127.0.0.1:8766), got {text!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host``: ``localhost`` or a loopback address. Any
    other name may resolve to an address others reach, so it counts as open."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _namespace(text: str) -> str:
    if not text or not all(ch.isalnum() or ch in "_-." for ch in text) or text.startswith("."):
        raise argparse.ArgumentTypeError(
            f"must be a tool-name prefix such as 'hr' (letters, digits, _ - .), got {text!r}"
        )
    return text.rstrip(".")


def _header_from_env(text: str) -> tuple[str, str]:
    name, sep, env = text.partition("=")
    if not sep or not name.strip() or not env.strip() or " " in name.strip():
        raise argparse.ArgumentTypeError(
            f"must be NAME=ENVVAR (e.g. Authorization=HR_MCP_AUTH), got {text!r}"
        )
    return name.strip(), env.strip()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="saga-mcp",
        description="An MCP gateway that records every tool call in Saga Admin (ledger, approvals, undo). "
        "The API key is read from SAGA_API_KEY only.",
    )
    p.add_argument("--saga-url", required=True, help="Saga Admin's base URL, e.g. https://saga.example.com")
    p.add_argument(
        "--upstream",
        required=True,
        help="the MCP server to put in front of: its Streamable HTTP URL, or a command line to start over stdio",
    )
    p.add_argument(
        "--agent",
        default=DEFAULT_AGENT,
        help=f"the agent name runs are recorded under (default {DEFAULT_AGENT})",
    )
    p.add_argument("--namespace", type=_namespace, default="", help="record tool NAME as NS.NAME")
    p.add_argument(
        "--listen",
        type=_listen,
        metavar="HOST:PORT",
        help="serve Streamable HTTP at http://HOST:PORT/mcp (default: stdio); on an address other than "
        f"loopback it refuses to start without {TOKEN_ENV}, and with {TOKEN_ENV} set every request must "
        "carry it as a bearer token",
    )
    p.add_argument(
        "--approval-timeout",
        type=_positive,
        default=DEFAULT_APPROVAL_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long a call waits for an approval decision (default {DEFAULT_APPROVAL_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--call-timeout",
        type=_positive,
        default=DEFAULT_CALL_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long a forwarded call may take before it is recorded unknown (default {DEFAULT_CALL_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--idle-timeout",
        type=_positive,
        default=DEFAULT_IDLE_TIMEOUT_S,
        metavar="SECONDS",
        help="an HTTP session (or a stateless client's run) idle this long ends "
        f"(default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--upstream-header",
        action="append",
        default=[],
        type=_header_from_env,
        metavar="NAME=ENVVAR",
        help="send header NAME to an HTTP upstream, its value read from environment variable ENVVAR (repeatable)",
    )
    p.add_argument(
        "--heartbeat-interval", type=_positive, default=DEFAULT_HEARTBEAT_S, help=argparse.SUPPRESS
    )
    p.add_argument("--poll-interval", type=_positive, default=1.0, help=argparse.SUPPRESS)
    return p


def options_from(argv: list[str] | None, environ: Mapping[str, str]) -> Options:
    args = parser().parse_args(argv)
    api_key = environ.get("SAGA_API_KEY", "").strip()
    if not api_key:
        raise GatewayError(
            "saga-mcp: SAGA_API_KEY is not set. The gateway reads its Saga Admin key from that environment "
            "variable only (never a flag: command lines are visible to every user of the machine)."
        )
    missing = [env for _, env in args.upstream_header if not environ.get(env)]
    if missing:
        raise GatewayError(
            f"saga-mcp: --upstream-header reads {', '.join(missing)} from the environment, but it is not set."
        )
    url = urlsplit(args.saga_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise GatewayError(f"saga-mcp: --saga-url must be an http(s) URL, got {args.saga_url!r}.")
    # The gateway acts with its agent key: a listener others can reach must not hand that key's
    # power to whoever connects. Checked before anything starts, so nothing is ever served open.
    token = environ.get(TOKEN_ENV, "").strip()
    if args.listen is not None and not token and not is_loopback(args.listen[0]):
        raise GatewayError(
            f"saga-mcp: --listen {args.listen[0]}:{args.listen[1]} is not a loopback address, and "
            f"{TOKEN_ENV} is not set. The gateway calls tools with its Saga Admin key, so a listener "
            f"other machines can reach needs a bearer token: set {TOKEN_ENV} (every HTTP request must "
            "then send `Authorization: Bearer <token>`), or listen on 127.0.0.1."
        )
    return Options(
        saga_url=args.saga_url,
        api_key=api_key,
        upstream=args.upstream,
        agent=args.agent,
        namespace=args.namespace,
        listen=args.listen,
        approval_timeout_s=args.approval_timeout,
        call_timeout_s=args.call_timeout,
        idle_timeout_s=args.idle_timeout,
        upstream_headers=tuple(args.upstream_header),
        heartbeat_s=args.heartbeat_interval,
        poll_interval_s=args.poll_interval,
        token=token,
    )


def upstream_target(
    upstream: str, environ: Mapping[str, str], http_client: httpx2.AsyncClient | None = None
) -> Any:
    """A Streamable HTTP transport (over ``http_client`` when headers must be sent), or the
    command line to start over stdio. The child gets the gateway's environment minus the Saga
    Admin key and the listener's token: the upstream has no business with either."""
    if is_url(upstream):
        return upstream if http_client is None else streamable_http_client(upstream, http_client=http_client)
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


# --- Sessions and their runs -----------------------------------------------------------------


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass
class Session:
    """One MCP session (or, for a stateless client, one run it may come back to) and its run."""

    key: str
    client: str = ""
    stateless: bool = False
    # Who opened it: a digest of the bearer token its first request carried ("" without one).
    # Only a request with the same token may use the session or attach to its run.
    caller: str = ""
    run_id: str = ""
    calls: int = 0
    # The calls that failed and were not since retried successfully, by (tool, arguments).
    failed: dict[str, tuple[str, str]] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    open_requests: int = 0
    cancelled: str = ""
    ended: bool = False
    outbound: ServerSession | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    heartbeat: anyio.CancelScope | None = None

    def touch(self) -> None:
        self.last_seen = time.monotonic()


def _tool_error(message: str, *, run_id: str = "", action_id: str = "") -> types.CallToolResult:
    meta: dict[str, Any] = {}
    if run_id:
        meta[RUN_META] = run_id
    if action_id:
        meta[ACTION_META] = action_id
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True, _meta=meta or None
    )


def _with_meta(result: types.CallToolResult, *, run_id: str, action_id: str) -> types.CallToolResult:
    meta = dict(result.meta or {})
    meta[RUN_META] = run_id
    meta[ACTION_META] = action_id
    return result.model_copy(update={"meta": meta})


def _caller_of(ctx: ServerRequestContext[Any]) -> str:
    """A digest of the bearer token the request carried ("" over stdio or without one): enough
    to tell two callers apart without keeping the token in each session."""
    headers = getattr(ctx.request, "headers", None)
    given = (headers.get("authorization") if headers is not None else None) or ""
    token = given.partition(" ")[2].strip()
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


def _approval(action: Mapping[str, Any]) -> Mapping[str, Any]:
    """The action's approval, or an empty one when it has none."""
    approval: Mapping[str, Any] = action.get("approval") or {}
    return approval


def _refusal(exc: SagaError) -> str:
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
    if isinstance(exc, SagaAPIError):
        return f"Saga Admin refused to record this call ({exc.code}), so it was not made: {exc.message}"
    return f"Saga Admin could not record this call, so it was not made: {exc}"


class Gateway:
    """The MCP server side (a low-level ``Server`` whose handlers pass the upstream's tools
    through) and the ledger side (an ``AsyncSaga``), joined per call."""

    def __init__(self, options: Options, upstream: Client, saga: AsyncSaga, *, upstream_label: str) -> None:
        self.options = options
        self.upstream = upstream
        self.saga = saga
        self.upstream_label = upstream_label
        self.sessions: dict[str, Session] = {}
        self.process_key = uuid.uuid4().hex
        # Sent with every record: Saga Admin undoes a call only through a compensator that reaches
        # this upstream, and makes any other undo wait for a person.
        self.via = {"gateway": f"saga-mcp/{_version()}", "upstream": upstream_label[:2000]}
        self.server = _GatewayServer(
            "saga-mcp",
            version=_version(),
            instructions=upstream.instructions,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._task_group: anyio.abc.TaskGroup | None = None

    # Tools --------------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            session = self._session_for(ctx, create=False)
        except LookupError:
            session = None
        if session is not None:
            session.touch()
            session.outbound = ctx.session
        listed = await self.upstream.list_tools(cursor=params.cursor if params else None, cache_mode="bypass")
        return types.ListToolsResult(tools=listed.tools, next_cursor=listed.next_cursor)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        meta = dict(params.meta or {})
        try:
            session = self._session_for(ctx, create=True, asked_run=meta.get(RUN_META))
        except LookupError as exc:
            return _tool_error(str(exc))
        assert session is not None
        session.outbound = ctx.session
        session.in_flight += 1
        session.touch()
        try:
            return await self._record_and_forward(ctx, session, params, meta)
        finally:
            session.in_flight -= 1
            session.touch()

    async def _record_and_forward(
        self,
        ctx: ServerRequestContext[Any],
        session: Session,
        params: types.CallToolRequestParams,
        meta: dict[str, Any],
    ) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        recorded_tool = self.options.recorded_name(params.name)
        if session.cancelled:
            return _tool_error(
                f"This run was cancelled in Saga Admin ({session.cancelled}); the call was not made.",
                run_id=session.run_id,
            )
        try:
            run_id = await self._ensure_run(session, ctx)
            recorded = await self.saga.record_action_reply(
                run_id,
                tool=recorded_tool,
                idempotency_key=self._call_key(session, ctx),
                args=arguments,
                intent={"reasoning": f"MCP tools/call {params.name} via saga-mcp", "mcp_tool": params.name},
                via=self.via,
                start=True,
            )
        except SagaError as exc:
            return _tool_error(_refusal(exc), run_id=session.run_id)
        action: ActionDict = recorded.data
        action_id = action["id"]
        # Only the request that moved the action to running forwards it. The key is derived
        # from the session and the JSON-RPC id, so a request sent again (the SDK runs a repeated
        # id's handler again) finds the first one's action: it must get that call's outcome,
        # not a second real call that limits and the ledger would never see.
        started_here = recorded.started_here
        try:
            if action["status"] in ("awaiting_approval", "rejected"):
                decided = await self._wait_for_decision(ctx, action)
                if isinstance(decided, str):
                    return _tool_error(decided, run_id=run_id, action_id=action_id)
                action = decided
            if not started_here and action["status"] in ("planned", "approved"):
                # Not started yet (approved while we waited): whoever starts it first forwards
                # it; the start's shared key makes every later start of this attempt a replay.
                started = await self.saga.start_action_reply(action)
                action, started_here = started.data, started.started_here
        except SagaError as exc:
            return _tool_error(_refusal(exc), run_id=run_id, action_id=action_id)
        if not started_here:
            return await self._first_outcome(recorded_tool, action, run_id=run_id)
        # From here the call is recorded and started: forward the args as recorded (an approver's
        # edit included), never what the client sent if the two differ.
        recorded_args = action.get("args")
        forwarded_args: dict[str, Any] = recorded_args if isinstance(recorded_args, dict) else arguments
        return await self._forward(session, recorded_tool, params.name, forwarded_args, action)

    async def _forward(
        self,
        session: Session,
        recorded_tool: str,
        name: str,
        arguments: dict[str, Any],
        action: ActionDict,
    ) -> types.CallToolResult:
        run_id, action_id = session.run_id, action["id"]
        failure_key = _canonical([recorded_tool, arguments])
        try:
            with anyio.fail_after(self.options.call_timeout_s):
                result = await self.upstream.call_tool(name, arguments)
        except TimeoutError:
            message = (
                f"The upstream did not answer {name} within {self.options.call_timeout_s:g} s. It may or may "
                "not have happened: Saga Admin records it as unknown until someone checks."
            )
            await self._settle(action, error=message, outcome_unknown=True)
            session.failed[failure_key] = (action_id, message)
            return _tool_error(message, run_id=run_id, action_id=action_id)
        except Exception as exc:  # noqa: BLE001 - any upstream failure is the call's, recorded and told
            message = f"The upstream failed {name}: {_describe(exc)}"
            await self._settle(action, error=message)
            session.failed[failure_key] = (action_id, message)
            return _tool_error(message, run_id=run_id, action_id=action_id)
        if result.is_error:
            message = _result_text(result) or f"{name} returned an error"
            await self._settle(action, error=message)
            session.failed[failure_key] = (action_id, message)
        else:
            await self._settle(action, result=recorded_result(result))
            session.failed.pop(failure_key, None)
        return _with_meta(result, run_id=run_id, action_id=action_id)

    async def _first_outcome(self, tool: str, action: ActionDict, *, run_id: str) -> types.CallToolResult:
        """The answer to a request that did not start its action (sent again, or a replay of one
        already started): the first call's outcome as the ledger has it, waiting while that call
        still runs — never a second forward."""
        action_id = action["id"]
        bound = self.options.call_timeout_s + REPLAY_WAIT_MARGIN_S
        started, interval = time.monotonic(), self.options.poll_interval_s
        current = action
        try:
            current = await self.saga.get_action(action_id)
            while current["status"] == "running":
                waited = time.monotonic() - started
                if waited >= bound:
                    return _tool_error(
                        f"{tool} was already started by an earlier request and has not finished within "
                        f"{bound:g} s; it was not made again. Its outcome will be recorded in Saga Admin "
                        f"(action {action_id}).",
                        run_id=run_id,
                        action_id=action_id,
                    )
                await anyio.sleep(min(interval, max(bound - waited, 0.0)))
                interval = min(interval * 1.5, 5.0)
                current = await self.saga.get_action(action_id)
        except SagaError as exc:
            return _tool_error(
                f"{tool} was already started by an earlier request, so it was not made again; its outcome "
                f"could not be read from Saga Admin: {exc}",
                run_id=run_id,
                action_id=action_id,
            )
        status = current["status"]
        if status in DONE_STATES:
            return _with_meta(result_from_record(current.get("result")), run_id=run_id, action_id=action_id)
        if status in ("failed", "unknown") and current.get("error"):
            return _tool_error(current["error"], run_id=run_id, action_id=action_id)
        return _tool_error(
            f"Saga Admin has {tool} as {status}, not running; the call was not made.",
            run_id=run_id,
            action_id=action_id,
        )

    async def _settle(
        self, action: ActionDict, *, result: Any = None, error: str = "", outcome_unknown: bool = False
    ) -> None:
        """Record how a forwarded call ended. The call already happened, so a ledger outage here
        does not change the answer the agent gets: the action stays running and the server's
        stuck-run sweep brings it to a person."""
        try:
            if error:
                await self.saga.fail_action(
                    action,
                    error=error[:20000],
                    retryable=not outcome_unknown,
                    layer="tool",
                    outcome_unknown=outcome_unknown,
                )
            else:
                await self.saga.succeed_action(action, result=result)
        except SagaError as exc:
            log.warning("could not record the outcome of %s: %s", action.get("id"), exc)

    async def _wait_for_decision(
        self, ctx: ServerRequestContext[Any], action: ActionDict
    ) -> ActionDict | str:
        """Poll the action until a person decides, reporting progress when the client asked for
        it. The approved action, or the tool error's text."""
        timeout = self.options.approval_timeout_s
        approval = _approval(action)
        started = time.monotonic()
        interval = self.options.poll_interval_s
        current = action
        while (
            current["status"] == "awaiting_approval"
            and _approval(current).get("status") != "expired"
        ):
            waited = time.monotonic() - started
            await ctx.session.report_progress(
                min(waited, timeout),
                timeout,
                f"Waiting for a person to approve {current['tool']} in Saga Admin "
                f"(approval {approval.get('id', '')}, {int(waited)} of {timeout:g} s)",
            )
            if waited >= timeout:
                return (
                    f"No one approved {current['tool']} within {timeout:g} s, so the call was not made. "
                    f"Approval {approval.get('id', '')} is still open in Saga Admin."
                )
            await anyio.sleep(min(interval, max(timeout - waited, 0.0)))
            interval = min(interval * 1.5, 5.0)
            current = await self.saga.get_action(current["id"])
        if _approval(current).get("status") == "expired":
            return f"The approval of {current['tool']} expired in Saga Admin; the call was not made."
        if current["status"] == "rejected":
            reason = _approval(current).get("reason") or ""
            because = f" Reason: {reason}" if reason else ""
            return f"{current['tool']} was rejected in Saga Admin; the call was not made.{because}"
        return current

    # Sessions -----------------------------------------------------------------------------

    def _session_for(
        self, ctx: ServerRequestContext[Any], *, create: bool, asked_run: Any = None
    ) -> Session | None:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            if not create:
                return None
            if asked_run is None:
                return self._new_session(f"stateless:{uuid.uuid4().hex}", ctx, stateless=True)
            caller = _caller_of(ctx)
            for session in self.sessions.values():
                if (
                    session.stateless
                    and session.run_id == asked_run
                    and not session.ended
                    and hmac.compare_digest(session.caller, caller)
                ):
                    return session
            raise LookupError(
                f'_meta["{RUN_META}"] names {str(asked_run)[:100]!r}, which is not a run this gateway started or '
                "it has ended; the call was not made. Leave it out to start a new run."
            )
        headers = getattr(ctx.request, "headers", None)
        key = (headers.get("mcp-session-id") if headers is not None else None) or "stdio"
        found = self.sessions.get(key)
        if found is not None and not found.ended:
            if not hmac.compare_digest(found.caller, _caller_of(ctx)):
                raise LookupError("This MCP session belongs to another caller; the call was not made.")
            return found
        if not create:
            return None
        return self._new_session(key, ctx, stateless=False)

    def _new_session(self, key: str, ctx: ServerRequestContext[Any], *, stateless: bool) -> Session:
        info = ctx.session.client_params.client_info if ctx.session.client_params else None
        client = f"{info.name} {info.version}".strip() if info is not None else ""
        session = Session(key=key, client=client, stateless=stateless, caller=_caller_of(ctx))
        self.sessions[key] = session
        return session

    def _call_key(self, session: Session, ctx: ServerRequestContext[Any]) -> str:
        if session.stateless:
            # No session to scope a request id to (each HTTP request may start again at id 1):
            # a stateless call is its own attempt.
            return f"mcp-{uuid.uuid4().hex}"
        scope = f"{self.process_key}:{session.key}:{ctx.request_id!r}"
        return "mcp-" + hashlib.sha256(scope.encode()).hexdigest()[:48]

    async def _ensure_run(self, session: Session, ctx: ServerRequestContext[Any]) -> str:
        async with session.lock:
            if session.run_id:
                return session.run_id
            client = session.client or "an MCP client"
            run = await self.saga.create_run(
                agent=self.options.agent,
                request=f"MCP session of {client} through saga-mcp, calling {self.upstream_label}",
                idempotency_key=f"mcp-run-{self.process_key}-{hashlib.sha256(session.key.encode()).hexdigest()[:32]}",
                metadata={
                    "gateway": "saga-mcp",
                    "mcp_client": session.client,
                    "mcp_protocol_version": ctx.protocol_version,
                    "mcp_transport": "stateless"
                    if session.stateless
                    else ("http" if session.key != "stdio" else "stdio"),
                    "upstream": self.upstream_label,
                },
            )
            session.run_id = run["id"]
            self._start_heartbeat(session)
            return session.run_id

    def _start_heartbeat(self, session: Session) -> None:
        if self._task_group is None:
            return
        scope = anyio.CancelScope()
        session.heartbeat = scope

        async def beat() -> None:
            with scope:
                while True:
                    await anyio.sleep(self.options.heartbeat_s)
                    try:
                        commands = await self.saga.heartbeat(
                            session.run_id, note=f"{session.calls} call(s) open" if session.in_flight else ""
                        )
                    except SagaError as exc:
                        log.warning("heartbeat for %s failed: %s", session.run_id, exc)
                        continue
                    for command in commands:
                        if command.get("kind") == "cancel":
                            session.cancelled = "an operator cancelled it"

        self._task_group.start_soon(beat)

    async def end_session(self, session: Session, *, why: str) -> None:
        """Finish a session's run: failed when a failed call was not since retried successfully
        (it lands in the recovery queue), completed otherwise."""
        if session.ended:
            return
        session.ended = True
        if session.heartbeat is not None:
            session.heartbeat.cancel()
        self.sessions.pop(session.key, None)
        if not session.run_id or session.cancelled:
            return
        try:
            if session.failed:
                action_id, message = list(session.failed.values())[-1]
                count = len(session.failed)
                await self.saga.fail_run(
                    session.run_id,
                    f"The MCP session ended ({why}) after {count} failed call(s) that were not retried "
                    f"successfully; the last: {message}"[:20000],
                    failed_action_id=action_id,
                    idempotency_key=f"mcp-end-{session.run_id}",
                )
            else:
                await self.saga.complete_run(
                    session.run_id, f"MCP session ended ({why}).", idempotency_key=f"mcp-end-{session.run_id}"
                )
        except SagaError as exc:
            # The run stays running; without heartbeats the server's stuck-run sweep takes it.
            log.warning("could not finish run %s: %s", session.run_id, exc)

    async def end_all(self, *, why: str) -> None:
        with anyio.CancelScope(shield=True):
            for session in list(self.sessions.values()):
                await self.end_session(session, why=why)

    async def reap_idle(self) -> None:
        """End sessions (and stateless runs) nothing has used for the idle time-out."""
        while True:
            await anyio.sleep(min(self.options.idle_timeout_s / 4, 30.0))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.key == "stdio" or session.in_flight or session.open_requests:
                    continue
                if now - session.last_seen >= self.options.idle_timeout_s:
                    await self.end_session(session, why=f"idle for {self.options.idle_timeout_s:g} s")

    async def forward_list_changes(self) -> None:
        """Tell every open session that the upstream's tools changed."""
        for session in list(self.sessions.values()):
            if session.outbound is not None and not session.stateless:
                try:
                    await session.outbound.send_tool_list_changed()
                except Exception as exc:  # noqa: BLE001 - a closed session must not stop the others
                    log.debug("could not tell %s about a tool list change: %s", session.key, exc)

    def run_with(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group


class _GatewayServer(Server[Any]):
    """The low-level server, announcing ``tools.listChanged``: the gateway forwards the
    upstream's changes (the streamable-HTTP manager asks the server for its options itself)."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # an exception group (anyio's task groups wrap errors)
    if isinstance(inner, tuple):
        return "; ".join(_describe(each) for each in inner)
    if isinstance(exc, MCPError):
        return f"{exc.message} (JSON-RPC {exc.code})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("saga-admin-client")
    except Exception:  # noqa: BLE001 - a source checkout has no distribution metadata
        return "0"


# --- Serving ---------------------------------------------------------------------------------


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
        if options.upstream_headers and is_url(options.upstream):
            headers = {name: environ[env] for name, env in options.upstream_headers}
            http_client = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
            )
        target = upstream_target(options.upstream, environ, http_client)
        upstream = Client(target, mode="legacy", message_handler=on_message, cache=None)
        try:
            # No deadline around entering: the client's task group must outlive the scope it
            # is entered in (anyio refuses otherwise). A dead upstream fails fast on its own.
            await stack.enter_async_context(upstream)
            with anyio.fail_after(30):
                await upstream.list_tools(cache_mode="bypass")
        except Exception as exc:  # noqa: BLE001 - whatever stops the upstream from answering, said once
            raise GatewayError(
                f"saga-mcp: the upstream MCP server {label} did not answer ({_describe(exc)}). "
                "Check --upstream: nothing was started.",
                status=1,
            ) from None
        saga = await stack.enter_async_context(
            AsyncSaga(options.saga_url, options.api_key, retries=2, backoff_s=0.2, max_backoff_s=1.0)
        )
        gateway = Gateway(options, upstream, saga, upstream_label=label)
        gateway_ref.append(gateway)
        async with anyio.create_task_group() as tg:
            gateway.run_with(tg)
            tg.start_soon(gateway.reap_idle)
            try:
                if options.listen is None:
                    await _serve_stdio(gateway)
                else:
                    await _serve_http(gateway, *options.listen)
            finally:
                await gateway.end_all(
                    why="the gateway stopped" if options.listen else "the client disconnected"
                )
                tg.cancel_scope.cancel()


async def _serve_stdio(gateway: Gateway) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await gateway.server.run(read_stream, write_stream, gateway.server.create_initialization_options())


async def _serve_http(gateway: Gateway, host: str, port: int) -> None:
    import uvicorn

    options = gateway.options
    app: Any = _SessionTracker(
        OneRequestPerId(
            gateway.server.streamable_http_app(host=host, session_idle_timeout=options.idle_timeout_s),
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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("SAGA_MCP_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    try:
        options = options_from(argv, os.environ)
        asyncio.run(serve(options, os.environ))
    except GatewayError as exc:
        print(str(exc), file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
