"""The gateway's sessions and their runs: which session (or stateless run) a request belongs to and
whether its caller may use it, the run each one records into (created at its first call, kept
alive by heartbeats), and how it ends (completed, or failed into the recovery queue when a call
failed and was not retried successfully)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from mcp.server.context import ServerRequestContext
from mcp.server.session import ServerSession
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from saga_client._failures import UnretriedFailures
from saga_client.aio import AsyncSaga
from saga_client.errors import SagaError
from saga_client.mcp.options import Options
from saga_client.mcp.results import RUN_META

log = logging.getLogger(__name__)


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
    # The calls that failed and were not since retried successfully (the run's end rule).
    failed: UnretriedFailures = field(default_factory=UnretriedFailures)
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


def _caller_of(ctx: ServerRequestContext[Any]) -> str:
    """A digest of the bearer token the request carried ("" over stdio or without one): enough
    to tell two callers apart without keeping the token in each session."""
    headers = getattr(ctx.request, "headers", None)
    given = (headers.get("authorization") if headers is not None else None) or ""
    token = given.partition(" ")[2].strip()
    return hashlib.sha256(token.encode()).hexdigest() if token else ""


class GatewaySessions:
    """The session half of the ``Gateway`` (``saga_client.mcp.gateway``), which sets these."""

    options: Options
    saga: AsyncSaga
    sessions: dict[str, Session]
    process_key: str
    upstream_label: str
    _task_group: anyio.abc.TaskGroup | None

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
        (it lands in the recovery queue), completed otherwise. The approvals its calls still waited
        for are withdrawn with it: the session that would have made those calls is gone."""
        if session.ended:
            return
        session.ended = True
        if session.heartbeat is not None:
            session.heartbeat.cancel()
        self.sessions.pop(session.key, None)
        if not session.run_id or session.cancelled:
            return
        try:
            verdict = session.failed.verdict(f"The MCP session ended ({why})")
            if verdict is not None:
                report, action_id = verdict
                await self.saga.fail_run(
                    session.run_id,
                    report,
                    failed_action_id=action_id,
                    withdraw_approvals=True,
                    idempotency_key=f"mcp-end-{session.run_id}",
                )
            else:
                await self.saga.complete_run(
                    session.run_id,
                    f"MCP session ended ({why}).",
                    withdraw_approvals=True,
                    idempotency_key=f"mcp-end-{session.run_id}",
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
