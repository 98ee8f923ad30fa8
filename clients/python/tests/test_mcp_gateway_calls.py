"""One ``tools/call`` through the gateway with the ledger scripted (no server) and a fake upstream:
what is recorded, when the upstream is called (one approval, one call: only the request that
moved its action to ``running`` forwards it), and what a request that did not start it answers
(``_first_outcome``). Then the sessions: whose a request is, and the key a call is recorded under."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

types = pytest.importorskip("mcp_types")
anyio = pytest.importorskip("anyio")

from scripted import Script, error  # noqa: E402

from saga_client import AsyncSaga  # noqa: E402
from saga_client.mcp import gateway as gateway_module  # noqa: E402
from saga_client.mcp.gateway import Gateway  # noqa: E402
from saga_client.mcp.options import Options  # noqa: E402
from saga_client.mcp.results import ACTION_META, RUN_META, recorded_result, result_text  # noqa: E402
from saga_client.mcp.sessions import Session, _caller_of  # noqa: E402

LEGACY = "2025-06-18"
STATELESS = "2026-07-28"
RUN = {"id": "run_1", "status": "running"}
ARGS = {"email": "ashu@company.com"}
REPLAYED = {"Idempotent-Replayed": "true"}


def action(status: str, **fields: Any) -> Any:
    return {
        "id": "act_1",
        "run_id": "run_1",
        "tool": "hr.create_user",
        "status": status,
        "args": ARGS,
        "attempts": 1,
        "idempotency_key": "key_1",
        "approval": None,
        "result": None,
        "error": "",
        **fields,
    }


class Upstream:
    """The MCP server behind the gateway: records each call, answers with ``answer``."""

    instructions = None

    def __init__(self, answer: Any = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.answer = answer if answer is not None else types.CallToolResult(content=[text("created")])

    async def call_tool(self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None) -> Any:
        self.calls.append((name, arguments))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    async def ensure_reachable(self) -> None:
        return None


def text(value: str) -> Any:
    return types.TextContent(type="text", text=value)


def context(*, session_id: str = "s-1", token: str = "", request_id: int = 1, protocol: str = LEGACY) -> Any:
    headers = {"mcp-session-id": session_id} if session_id else {}
    if token:
        headers["authorization"] = f"Bearer {token}"
    progress: list[tuple[float, float | None, str | None]] = []

    async def report_progress(done: float, total: float | None = None, message: str | None = None) -> None:
        progress.append((done, total, message))

    return SimpleNamespace(
        request=SimpleNamespace(headers=headers),
        request_id=request_id,
        protocol_version=protocol,
        session=SimpleNamespace(client_params=None, report_progress=report_progress),
        progress=progress,
    )


def gateway(
    script: Script, upstream: Upstream, *, policies: list[dict[str, Any]] | None = None, **options: Any
) -> Gateway:
    """A gateway whose copy of the tenant's policies is ``policies`` and current (no GET
    /policies in the script; tests/client/test_mcp_before_images.py revalidates for real)."""
    saga = AsyncSaga("http://saga.test", "sk_test", transport=httpx.MockTransport(script.handle), retries=0)
    settings = {
        "poll_interval_s": 0.01,
        "approval_timeout_s": 5.0,
        "call_timeout_s": 5.0,
        "policy_refresh_s": 3600.0,
        **options,
    }
    gw = Gateway(
        Options(
            saga_url="http://saga.test",
            api_key="sk_test",
            upstream="http://hr/mcp",
            namespace="hr",
            **settings,
        ),
        upstream,  # type: ignore[arg-type]
        saga,
        upstream_label="http://hr/mcp",
    )
    gw.policies.policies, gw.policies.loaded = list(policies or []), True
    gw.policies.checked_at = time.monotonic()
    return gw


def call(gw: Gateway, ctx: Any = None, arguments: dict[str, Any] | None = None) -> Any:
    params = types.CallToolRequestParams(name="create_user", arguments=dict(arguments or ARGS))
    return anyio.run(gw._call_tool, ctx or context(), params)


def body(request: httpx.Request) -> Any:
    return json.loads(request.content)


# --- One approval, one call ------------------------------------------------------------------


def test_a_fresh_record_that_started_the_action_forwards_it_once_and_records_the_result():
    script = Script((201, RUN), (201, action("running")), (200, action("succeeded")))
    upstream = Upstream()
    result = call(gateway(script, upstream))
    assert upstream.calls == [("create_user", ARGS)]
    assert script.paths() == ["POST /runs", "POST /runs/run_1/actions", "POST /actions/act_1/succeed"]
    recorded = body(script.seen[1])
    assert (recorded["tool"], recorded["args"], recorded["start"]) == ("hr.create_user", ARGS, True)
    assert recorded["via"] == {"gateway": recorded["via"]["gateway"], "upstream": "http://hr/mcp"}
    assert body(script.seen[2])["result"] == "created"
    assert result_text(result) == "created" and not result.is_error
    assert result.meta == {RUN_META: "run_1", ACTION_META: "act_1"}


def test_the_recorded_args_are_forwarded_when_an_approver_edited_them():
    edited = {"email": "ashu.kumar@company.com"}
    script = Script((201, RUN), (201, action("running", args=edited)), (200, action("succeeded")))
    upstream = Upstream()
    call(gateway(script, upstream))
    assert upstream.calls == [("create_user", edited)]


def test_a_replayed_record_is_answered_with_the_first_calls_outcome_never_forwarded():
    first = types.CallToolResult(content=[text("created")], structured_content={"user_id": "u_1"})
    script = Script(
        (201, RUN),
        (200, action("running"), REPLAYED),
        (200, action("running")),
        (200, action("succeeded", result=recorded_result(first))),
    )
    upstream = Upstream()
    result = call(gateway(script, upstream))
    assert upstream.calls == []
    assert script.paths()[-2:] == ["GET /actions/act_1", "GET /actions/act_1"]
    assert result.structured_content == {"user_id": "u_1"} and result_text(result) == "created"
    assert result.meta == {RUN_META: "run_1", ACTION_META: "act_1"}


def test_an_approved_call_is_started_then_forwarded_by_the_request_whose_start_was_not_a_replay():
    pending = action("awaiting_approval", approval={"id": "apr_1", "status": "pending"})
    script = Script(
        (201, RUN),
        (201, pending),
        (200, action("approved", approval={"id": "apr_1", "status": "approved"})),
        (200, action("running")),
        (200, action("succeeded")),
    )
    upstream = Upstream()
    ctx = context()
    result = call(gateway(script, upstream), ctx)
    assert upstream.calls == [("create_user", ARGS)] and not result.is_error
    assert script.paths()[2:] == [
        "GET /actions/act_1",
        "POST /actions/act_1/start",
        "POST /actions/act_1/succeed",
    ]
    assert "Waiting for a person to approve hr.create_user" in ctx.progress[0][2]


def test_an_approved_call_another_request_started_first_is_not_forwarded_again():
    script = Script(
        (201, RUN),
        (201, action("approved")),
        (200, action("running"), REPLAYED),
        (200, action("failed", error="mail server refused")),
    )
    upstream = Upstream()
    result = call(gateway(script, upstream))
    assert upstream.calls == []
    assert result.is_error and result_text(result) == "mail server refused"


@pytest.mark.parametrize(
    "decided, says",
    [
        (
            action("rejected", approval={"id": "apr_1", "status": "rejected", "reason": "not yet"}),
            "Reason: not yet",
        ),
        (action("awaiting_approval", approval={"id": "apr_1", "status": "expired"}), "expired"),
    ],
)
def test_a_rejected_or_expired_approval_is_a_tool_error_and_never_forwarded(decided, says):
    pending = action("awaiting_approval", approval={"id": "apr_1", "status": "pending"})
    script = Script((201, RUN), (201, pending), (200, decided))
    upstream = Upstream()
    result = call(gateway(script, upstream))
    assert upstream.calls == [] and result.is_error and says in result_text(result)
    assert "the call was not made" in result_text(result)


def test_a_refused_record_is_a_tool_error_and_never_forwarded():
    script = Script((201, RUN), (403, error("policy_denied", "hr.create_user is over its limit")))
    upstream = Upstream()
    result = call(gateway(script, upstream))
    assert upstream.calls == [] and result.is_error
    assert result_text(result).startswith("Denied by a Saga Admin policy, so the call was not made")
    assert result.meta == {RUN_META: "run_1"}


@pytest.mark.parametrize(
    "failure, unknown, says",
    [
        (RuntimeError("boom"), False, "The upstream failed create_user: RuntimeError: boom"),
        (TimeoutError(), True, "did not answer create_user within"),
    ],
)
def test_an_upstream_failure_is_recorded_and_told(failure, unknown, says):
    script = Script((201, RUN), (201, action("running")), (200, action("failed")))
    gw = gateway(script, Upstream(failure))
    ctx = context()
    result = call(gw, ctx)
    assert result.is_error and says in result_text(result)
    failed = body(script.seen[2])
    assert script.paths()[2] == "POST /actions/act_1/fail"
    assert (failed["outcome_unknown"], failed["retryable"]) == (unknown, not unknown)
    session = gw.sessions["s-1"]
    verdict = session.failed.verdict("The MCP session ended")
    assert verdict is not None and verdict[1] == "act_1"


def test_an_error_result_from_the_upstream_is_recorded_failed_and_passed_on():
    answer = types.CallToolResult(content=[text("no such department")], is_error=True)
    script = Script((201, RUN), (201, action("running")), (200, action("failed")))
    result = call(gateway(script, Upstream(answer)))
    assert result.is_error and result_text(result) == "no such department"
    assert body(script.seen[2])["error"] == "no such department"


# --- _first_outcome --------------------------------------------------------------------------


def first_outcome(script: Script, **options: Any) -> Any:
    gw = gateway(script, Upstream(), **options)
    return anyio.run(lambda: gw._first_outcome("hr.create_user", action("running"), run_id="run_1"))


def test_the_first_outcome_waits_while_the_first_call_runs():
    script = Script(
        (200, action("running")), (200, action("running")), (200, action("compensated", result="created"))
    )
    result = first_outcome(script)
    assert result_text(result) == "created" and not result.is_error and len(script.seen) == 3


def test_a_first_call_still_running_past_the_bound_is_not_made_again(monkeypatch):
    monkeypatch.setattr(gateway_module, "REPLAY_WAIT_MARGIN_S", 0.0)
    script = Script(*[(200, action("running"))] * 50)
    result = first_outcome(script, call_timeout_s=0.05)
    assert result.is_error and "already started by an earlier request and has not finished" in result_text(
        result
    )
    assert result.meta == {RUN_META: "run_1", ACTION_META: "act_1"}


@pytest.mark.parametrize(
    "answer, says",
    [
        ((200, action("unknown", error="timed out")), "timed out"),
        ((200, action("planned")), "Saga Admin has hr.create_user as planned, not running"),
        ((503, error("unavailable")), "its outcome could not be read from Saga Admin"),
    ],
)
def test_a_first_call_that_did_not_succeed_is_a_tool_error(answer, says):
    result = first_outcome(Script(answer))
    assert result.is_error and says in result_text(result)


# --- Sessions --------------------------------------------------------------------------------


def test_a_session_belongs_to_the_token_that_opened_it():
    gw = gateway(Script(), Upstream())
    mine = gw._session_for(context(token="alice"), create=True)
    assert mine is not None and mine.caller == _caller_of(context(token="alice"))
    assert gw._session_for(context(token="alice"), create=False) is mine
    with pytest.raises(LookupError, match="belongs to another caller"):
        gw._session_for(context(token="mallory"), create=True)
    with pytest.raises(LookupError):
        gw._session_for(context(token=""), create=True)


def test_stdio_is_one_session_and_an_ended_one_is_not_reused():
    gw = gateway(Script(), Upstream())
    stdio = gw._session_for(context(session_id=""), create=True)
    assert stdio is not None and stdio.key == "stdio"
    stdio.ended = True
    again = gw._session_for(context(session_id=""), create=True)
    assert again is not None and again is not stdio


def test_a_stateless_call_starts_a_run_unless_it_names_one_of_its_callers_runs():
    gw = gateway(Script(), Upstream())
    ctx = context(session_id="", token="alice", protocol=STATELESS)
    assert gw._session_for(ctx, create=False) is None
    first = gw._session_for(ctx, create=True)
    assert first is not None and first.stateless
    first.run_id = "run_1"
    assert gw._session_for(ctx, create=True, asked_run="run_1") is first
    with pytest.raises(LookupError, match="not a run this gateway started"):
        gw._session_for(ctx, create=True, asked_run="run_2")
    with pytest.raises(LookupError):
        gw._session_for(
            context(session_id="", token="mallory", protocol=STATELESS), create=True, asked_run="run_1"
        )


def test_a_calls_key_follows_its_session_and_request_id_and_a_stateless_call_is_its_own():
    gw = gateway(Script(), Upstream())
    session = Session(key="s-1")
    key = gw._call_key(session, context(request_id=7))
    assert key == gw._call_key(session, context(request_id=7)) and key.startswith("mcp-")
    assert key != gw._call_key(session, context(request_id=8))
    assert key != gw._call_key(Session(key="s-2"), context(request_id=7))
    stateless = Session(key="stateless:x", stateless=True)
    assert gw._call_key(stateless, context(request_id=7)) != gw._call_key(stateless, context(request_id=7))


def test_a_cancelled_sessions_call_is_refused_without_recording():
    script = Script()
    upstream = Upstream()
    gw = gateway(script, upstream)
    session = gw._session_for(context(), create=True)
    assert session is not None
    session.run_id, session.cancelled = "run_1", "an operator cancelled it"
    result = call(gw)
    assert result.is_error and "cancelled in Saga Admin" in result_text(result)
    assert script.seen == [] and upstream.calls == []
