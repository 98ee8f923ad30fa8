"""The gateway's before- and after-images with the ledger scripted (no server) and a fake upstream:
what a call whose policy has ``before`` sends (the before-image with the record, the after-image
with the success), that no image means no record and no forward, and the two ways a copy of the
policies can be behind (a record that shows a ``before`` the copy lacked, a value that changed
while an approval was awaited). The real thing: tests/client/test_mcp_before_images.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

types = pytest.importorskip("mcp_types")
anyio = pytest.importorskip("anyio")

from scripted import Script  # noqa: E402
from test_mcp_gateway_calls import RUN, action, context, gateway  # noqa: E402

from saga_client.mcp.results import result_text  # noqa: E402

BEFORE = {"tool": "hr.get_user", "args": {"email": "$args.email"}, "path": "user"}
POLICY = {"tool": "hr.create_user", "scope": "tenant", "before": BEFORE}
ARGS = {"email": "ashu@company.com"}


def structured(value: dict[str, Any]) -> Any:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(value))], structured_content=value
    )


class Upstream:
    """Answers each tool from its list of answers, in order; records every call."""

    instructions = None

    def __init__(self, **answers: list[Any]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None) -> Any:
        self.calls.append((name, arguments))
        answer = self.answers[name].pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def ensure_reachable(self) -> None:
        return None


def call(gw: Any) -> Any:
    params = types.CallToolRequestParams(name="create_user", arguments=dict(ARGS))
    return anyio.run(gw._call_tool, context(), params)


def body(request: Any) -> Any:
    return json.loads(request.content)


def test_the_before_image_goes_with_the_record_and_the_after_image_with_the_success():
    script = Script(
        (201, RUN), (201, action("running", policy={"before": BEFORE})), (200, action("succeeded"))
    )
    upstream = Upstream(
        get_user=[structured({"user": {"title": "Engineer"}}), structured({"user": {"title": "Lead"}})],
        create_user=[structured({"ok": True})],
    )
    result = call(gateway(script, upstream, policies=[POLICY]))
    assert not result.is_error, result_text(result)
    # The read is called as the upstream knows it: without the namespace.
    assert upstream.calls == [("get_user", ARGS), ("create_user", ARGS), ("get_user", ARGS)]
    assert body(script.seen[1])["before_snapshot"] == {"title": "Engineer"}
    assert body(script.seen[2])["after_snapshot"] == {"title": "Lead"}


@pytest.mark.parametrize(
    "read, says",
    [
        (
            types.CallToolResult(content=[types.TextContent(type="text", text="db down")], is_error=True),
            "db down",
        ),
        (structured({"nobody": True}), "has no 'user'"),
        (types.CallToolResult(content=[types.TextContent(type="text", text="a title")]), "not JSON"),
        (TimeoutError(), "did not answer within"),
        (RuntimeError("boom"), "RuntimeError: boom"),
    ],
)
def test_no_image_no_call_and_nothing_recorded(read, says):
    script = Script()
    upstream = Upstream(get_user=[read], create_user=[])
    result = call(gateway(script, upstream, policies=[POLICY]))
    assert result.is_error and "hr.get_user" in result_text(result) and says in result_text(result)
    assert upstream.calls == [("get_user", ARGS)]
    assert script.paths() == []  # no run, no action: nothing left running for a call not made


def test_an_after_read_that_fails_still_records_the_success_without_an_after_image():
    script = Script((201, RUN), (201, action("running")), (200, action("succeeded")))
    upstream = Upstream(
        get_user=[structured({"user": {"title": "Engineer"}}), RuntimeError("gone")],
        create_user=[structured({"ok": True})],
    )
    result = call(gateway(script, upstream, policies=[POLICY]))
    assert not result.is_error
    assert (
        body(script.seen[2])["after_snapshot"] is None and script.paths()[-1] == "POST /actions/act_1/succeed"
    )


def test_a_record_that_shows_a_before_the_copy_lacked_is_not_forwarded_and_the_copy_is_renewed():
    # The script answers GET /policies aside (scripted.Script), with the policies as they are now.
    script = Script(
        (201, RUN),
        (201, action("running", policy={"before": BEFORE})),
        (200, action("failed")),
        policies=[POLICY],
    )
    upstream = Upstream(get_user=[], create_user=[])
    gw = gateway(script, upstream, policies=[])
    result = call(gw)
    assert result.is_error and "call it again" in result_text(result)
    assert upstream.calls == []
    assert script.paths()[2:] == ["POST /actions/act_1/fail"]
    assert len(script.policy_requests) == 1
    assert body(script.seen[2])["retryable"] is True
    assert gw.policies.before_of("hr.create_user") == BEFORE and gw.policies.etag == '"p-1"'


@pytest.mark.parametrize("now, starts", [({"title": "Engineer"}, True), ({"title": "CTO"}, False)])
def test_an_approved_call_is_read_again_before_it_starts(now, starts):
    pending = action("awaiting_approval", approval={"id": "apr_1", "status": "pending"}, before_snapshot=None)
    approved = action(
        "approved", approval={"id": "apr_1", "status": "approved"}, before_snapshot={"title": "Engineer"}
    )
    answers: list[Any] = [(201, RUN), (201, pending), (200, approved)]
    if starts:
        answers += [(200, action("running")), (200, action("succeeded"))]
    script = Script(*answers)
    upstream = Upstream(
        get_user=[
            structured({"user": {"title": "Engineer"}}),
            structured({"user": now}),
            structured({"user": now}),
        ],
        create_user=[structured({"ok": True})],
    )
    result = call(gateway(script, upstream, policies=[POLICY]))
    assert result.is_error is not starts, result_text(result)
    assert ("POST /actions/act_1/start" in script.paths()) is starts
    assert (("create_user", ARGS) in upstream.calls) is starts
    if not starts:
        assert "no longer the one recorded" in result_text(result) and "approval still stands" in result_text(
            result
        )
