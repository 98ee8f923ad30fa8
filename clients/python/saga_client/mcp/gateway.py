"""The ``Gateway``: the MCP server side (a low-level ``Server`` whose handlers pass the upstream's
tools through) and the ledger side (an ``AsyncSaga``), joined per call — record, wait for a
person's decision, start, forward, record the outcome. One approval, one call: only the request
that moved its action to ``running`` forwards it; any other gets the first call's outcome
(``_first_outcome``). Its sessions are in ``saga_client.mcp.sessions``."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp import MCPError
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions

from saga_client._core import DONE_STATES
from saga_client._tracing import trace_context, valid_traceparent
from saga_client.aio import AsyncSaga
from saga_client.errors import SagaError
from saga_client.images import images_equal
from saga_client.mcp.before_reads import ReadFailed, describe_read, take_image
from saga_client.mcp.options import REPLAY_WAIT_MARGIN_S, Options
from saga_client.mcp.policy_cache import PolicyCache
from saga_client.mcp.results import (
    RUN_META,
    recorded_result,
    refusal,
    result_from_record,
    result_text,
    tool_error,
    with_meta,
)
from saga_client.mcp.sessions import GatewaySessions, Session
from saga_client.mcp.upstream import NotReached, UpstreamLink, lost_after_sending
from saga_client.responses import ActionDict

log = logging.getLogger(__name__)


def _approval(action: Mapping[str, Any]) -> Mapping[str, Any]:
    """The action's approval, or an empty one when it has none."""
    approval: Mapping[str, Any] = action.get("approval") or {}
    return approval


def _frozen_before(action: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``before`` read of the policy the server froze on the action (None: it has none)."""
    before = (action.get("policy") or {}).get("before")
    return before if isinstance(before, dict) and before.get("tool") else None


def _caller_trace(ctx: ServerRequestContext[Any], meta: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The trace context the agent sent with this call: MCP's ``_meta`` (``traceparent``,
    ``tracestate``), else the HTTP request's W3C headers."""
    if valid_traceparent(meta.get("traceparent")):
        state = meta.get("tracestate")
        return meta["traceparent"], state if isinstance(state, str) else None
    headers = getattr(ctx.request, "headers", None)
    if headers is None:
        return None, None
    return headers.get("traceparent"), headers.get("tracestate")


class Gateway(GatewaySessions):
    """The MCP server side (a low-level ``Server`` whose handlers pass the upstream's tools
    through) and the ledger side (an ``AsyncSaga``), joined per call."""

    def __init__(
        self, options: Options, upstream: UpstreamLink, saga: AsyncSaga, *, upstream_label: str
    ) -> None:
        self.options = options
        self.upstream = upstream
        self.saga = saga
        self.upstream_label = upstream_label
        self.sessions: dict[str, Session] = {}
        self.process_key = uuid.uuid4().hex
        # The tenant's policies, for the ``before`` reads of the calls it forwards.
        self.policies = PolicyCache(saga, refresh_s=options.policy_refresh_s)
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
        listed = await self.upstream.list_tools(params.cursor if params else None)
        return types.ListToolsResult(tools=listed.tools, next_cursor=listed.next_cursor)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        meta = dict(params.meta or {})
        try:
            session = self._session_for(ctx, create=True, asked_run=meta.get(RUN_META))
        except LookupError as exc:
            return tool_error(str(exc))
        assert session is not None
        session.outbound = ctx.session
        session.in_flight += 1
        session.touch()
        try:
            # The agent's trace goes on to Saga Admin with the record (saga_client._tracing).
            with trace_context(*_caller_trace(ctx, meta)):
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
        before, images = await self._before_image(session, recorded_tool, params.name, arguments)
        if isinstance(images, types.CallToolResult):
            return images
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
                **images,
            )
        except SagaError as exc:
            return tool_error(refusal(exc), run_id=session.run_id)
        action: ActionDict = recorded.data
        action_id = action["id"]
        frozen = _frozen_before(action)
        if before is None and frozen is not None and recorded.started_here:
            # The policy gained a ``before`` since our copy was revalidated: the call was recorded
            # without its image, so it is not made (recorded failed, retryable), and the copy is
            # brought up to date for the call made again.
            return await self._stale_policy(session, recorded_tool, params.name, arguments, action)
        # Only the request that moved the action to running forwards it. The key is derived
        # from the session and the JSON-RPC id, so a request sent again (the SDK runs a repeated
        # id's handler again) finds the first one's action: it must get that call's outcome,
        # not a second real call that limits and the ledger would never see.
        started_here = recorded.started_here
        try:
            if action["status"] in ("awaiting_approval", "rejected"):
                decided = await self._wait_for_decision(ctx, action)
                if isinstance(decided, str):
                    return tool_error(decided, run_id=run_id, action_id=action_id)
                action = decided
            if not started_here and action["status"] in ("planned", "approved"):
                # Not started yet (approved while we waited): whoever starts it first forwards
                # it; the start's shared key makes every later start of this attempt a replay.
                # Its approval is spent by the start: make sure first that the upstream can take
                # the call (a new session if it restarted meanwhile); else it stays approved.
                unreachable = await self._unreachable(recorded_tool) or await self._image_changed(
                    params.name, before or frozen, action
                )
                if unreachable:
                    return tool_error(unreachable, run_id=run_id, action_id=action_id)
                started = await self.saga.start_action_reply(action)
                action, started_here = started.data, started.started_here
        except SagaError as exc:
            return tool_error(refusal(exc), run_id=run_id, action_id=action_id)
        if not started_here:
            return await self._first_outcome(recorded_tool, action, run_id=run_id)
        # From here the call is recorded and started: forward the args as recorded (an approver's
        # edit included), never what the client sent if the two differ.
        recorded_args = action.get("args")
        forwarded_args: dict[str, Any] = recorded_args if isinstance(recorded_args, dict) else arguments
        return await self._forward(
            session, recorded_tool, params.name, forwarded_args, action, before or frozen
        )

    async def _before_image(
        self, session: Session, recorded_tool: str, name: str, arguments: dict[str, Any]
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | types.CallToolResult]:
        """The policy's ``before`` read (None without one) and the fields it adds to the record
        (``before_snapshot``), or the tool error that refuses the call: its read on this upstream
        gives the before-image, recorded with the call. No image, no call: nothing is recorded,
        nothing forwarded. A cancelled run takes no call at all."""
        if session.cancelled:
            return None, tool_error(
                f"This run was cancelled in Saga Admin ({session.cancelled}); the call was not made.",
                run_id=session.run_id,
            )
        try:
            await self.policies.refresh()
        except SagaError as exc:
            return None, tool_error(refusal(exc), run_id=session.run_id)
        before = self.policies.before_of(recorded_tool)
        if before is None:
            return None, {}
        try:
            return before, {"before_snapshot": await self._image(before, arguments)}
        except ReadFailed as exc:
            return before, tool_error(self._read_refusal(name, before, arguments, exc), run_id=session.run_id)

    async def _image(self, before: Mapping[str, Any], args: Any) -> Any:
        return await take_image(
            self.upstream,
            before,
            args,
            namespace=self.options.namespace,
            timeout_s=self.options.call_timeout_s,
        )

    def _read_refusal(self, name: str, before: Mapping[str, Any], args: Any, exc: ReadFailed) -> str:
        log.warning("saga-mcp: the before-read of %s gave no image (%s); the call was not made", name, exc)
        return (
            f"{name} was not made: its policy takes the value it changes first (the read "
            f"{describe_read(before, args)}), and that read gave no before-image: {exc}. Without it the "
            "change could not be undone exactly, so nothing was forwarded or recorded."
        )

    async def _image_changed(self, name: str, before: Any, action: ActionDict) -> str:
        """Before an approved call is started: why its recorded before-image no longer holds (""
        when it does). The read is made again with the approved args; a value someone changed
        during the approval wait (or args the approver edited) would make the undo restore the
        wrong value, so the call is not started and its approval stays unspent."""
        if not isinstance(before, dict):
            return ""
        recorded_args = action.get("args")
        try:
            now = await self._image(before, recorded_args if isinstance(recorded_args, dict) else {})
        except ReadFailed as exc:
            return (
                f"{name} was not started: the read {describe_read(before, recorded_args)} before it gave no "
                f"image ({exc}). Its approval still stands in Saga Admin; call it again once the read works."
            )
        if "before_snapshot" in action and not images_equal(now, action.get("before_snapshot")):
            return (
                f"{name} was not started: the value it changes is no longer the one recorded when it was "
                f"approved (read {describe_read(before, recorded_args)}), so its undo would restore the wrong "
                "value. Its approval still stands in Saga Admin; call it again to record it afresh."
            )
        return ""

    async def _stale_policy(
        self, session: Session, recorded_tool: str, name: str, arguments: dict[str, Any], action: ActionDict
    ) -> types.CallToolResult:
        message = (
            f"{name} was not made: its policy now takes a before-image, which this gateway's copy of the "
            "policies did not know yet. It is recorded failed; call it again (the copy is now current)."
        )
        await self._settle(action, error=message)
        session.failed.failed(recorded_tool, arguments, action["id"], message)
        try:
            await self.policies.refresh(force=True)
        except SagaError as exc:
            log.warning("saga-mcp: could not revalidate the policies: %s", exc)
        return tool_error(message, run_id=session.run_id, action_id=action["id"])

    async def _after_image(self, name: str, before: Mapping[str, Any], arguments: dict[str, Any]) -> Any:
        """The after-image, or None when the after-read gave none (logged: the call happened and is
        recorded a success, and its undo will have no drift check)."""
        try:
            return await self._image(before, arguments)
        except ReadFailed as exc:
            log.warning(
                "saga-mcp: the after-read of %s gave no image (%s); recording its success without an "
                "after_snapshot (its undo will have no drift check)",
                name,
                exc,
            )
            return None

    async def _forward(
        self,
        session: Session,
        recorded_tool: str,
        name: str,
        arguments: dict[str, Any],
        action: ActionDict,
        before: Mapping[str, Any] | None = None,
    ) -> types.CallToolResult:
        run_id, action_id = session.run_id, action["id"]
        try:
            # Sent once more, on a new session, only when the upstream did not accept it
            # (``saga_client.mcp.upstream``): one start, at most one call that ran.
            result = await self.upstream.call_tool(name, arguments, timeout_s=self.options.call_timeout_s)
        except NotReached as exc:
            message = (
                f"The upstream could not be reached, so {name} was not made: {exc.reason}. Saga Admin "
                "records it failed; call it again once the upstream is back."
            )
            await self._settle(action, error=message)
            session.failed.failed(recorded_tool, arguments, action_id, message)
            return tool_error(message, run_id=run_id, action_id=action_id)
        except TimeoutError:
            message = (
                f"The upstream did not answer {name} within {self.options.call_timeout_s:g} s. It may or may "
                "not have happened: Saga Admin records it as unknown until someone checks."
            )
            await self._settle(action, error=message, outcome_unknown=True)
            session.failed.failed(recorded_tool, arguments, action_id, message)
            return tool_error(message, run_id=run_id, action_id=action_id)
        except MCPError as exc:
            lost = lost_after_sending(exc)
            # A connection that broke after the request went out: the call may have run upstream.
            message = (
                f"The connection to the upstream broke while {name} was being made ({exc.message}). It may "
                "or may not have happened: Saga Admin records it as unknown until someone checks."
                if lost
                else f"The upstream failed {name}: {describe_error(exc)}"
            )
            await self._settle(action, error=message, outcome_unknown=lost)
            session.failed.failed(recorded_tool, arguments, action_id, message)
            return tool_error(message, run_id=run_id, action_id=action_id)
        except Exception as exc:  # noqa: BLE001 - any upstream failure is the call's, recorded and told
            message = f"The upstream failed {name}: {describe_error(exc)}"
            await self._settle(action, error=message)
            session.failed.failed(recorded_tool, arguments, action_id, message)
            return tool_error(message, run_id=run_id, action_id=action_id)
        if result.is_error:
            message = result_text(result) or f"{name} returned an error"
            await self._settle(action, error=message)
            session.failed.failed(recorded_tool, arguments, action_id, message)
        else:
            after = await self._after_image(name, before, arguments) if before is not None else None
            await self._settle(action, result=recorded_result(result), after_snapshot=after)
            session.failed.succeeded(recorded_tool, arguments)
        return with_meta(result, run_id=run_id, action_id=action_id)

    async def _unreachable(self, tool: str) -> str:
        """Why the upstream cannot take a call now ("" when it can)."""
        try:
            await self.upstream.ensure_reachable()
        except NotReached as exc:
            reason = exc.reason
        except TimeoutError:
            reason = "it did not answer a ping within 10 s"
        except MCPError as exc:
            if not lost_after_sending(exc):
                return ""  # it answered (an upstream without ping is still there): go on
            reason = describe_error(exc)
        else:
            return ""
        return (
            f"The upstream could not be reached ({reason}), so {tool} was not started: its approval "
            "still stands in Saga Admin. Call it again once the upstream is back."
        )

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
                    return tool_error(
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
            return tool_error(
                f"{tool} was already started by an earlier request, so it was not made again; its outcome "
                f"could not be read from Saga Admin: {exc}",
                run_id=run_id,
                action_id=action_id,
            )
        status = current["status"]
        if status in DONE_STATES:
            return with_meta(result_from_record(current.get("result")), run_id=run_id, action_id=action_id)
        if status in ("failed", "unknown") and current.get("error"):
            return tool_error(current["error"], run_id=run_id, action_id=action_id)
        return tool_error(
            f"Saga Admin has {tool} as {status}, not running; the call was not made.",
            run_id=run_id,
            action_id=action_id,
        )

    async def _settle(
        self,
        action: ActionDict,
        *,
        result: Any = None,
        error: str = "",
        outcome_unknown: bool = False,
        after_snapshot: Any = None,
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
                await self.saga.succeed_action(action, result=result, after_snapshot=after_snapshot)
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
        while current["status"] == "awaiting_approval" and _approval(current).get("status") != "expired":
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


def describe_error(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # an exception group (anyio's task groups wrap errors)
    if isinstance(inner, tuple):
        return "; ".join(describe_error(each) for each in inner)
    if isinstance(exc, MCPError):
        return f"{exc.message} (JSON-RPC {exc.code})"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("saga-admin-client")
    except Exception:  # noqa: BLE001 - a source checkout has no distribution metadata
        return "0"
