"""What saga-mcp records of an MCP result and the result it rebuilds from that record (a repeated
request is answered with the first call's result, content and all), and the tool errors it
answers with: no server, no upstream."""

from __future__ import annotations

from typing import Any

import pytest

types = pytest.importorskip("mcp_types")

from saga_client.errors import Paused, PolicyDenied, SagaAPIError, SagaError, SagaUnavailable  # noqa: E402
from saga_client.mcp.results import (  # noqa: E402
    ACTION_META,
    MCP_RESULT,
    RUN_META,
    recorded_result,
    refusal,
    result_from_record,
    result_text,
    tool_error,
    with_meta,
)


def text(value: str) -> Any:
    return types.TextContent(type="text", text=value)


def dumped(result: Any) -> dict:
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def test_one_plain_text_block_is_recorded_as_its_text():
    result = types.CallToolResult(content=[text("created ashu@company.com")])
    assert recorded_result(result) == "created ashu@company.com"
    assert dumped(result_from_record("created ashu@company.com")) == dumped(result)


def test_structured_content_is_recorded_as_itself_so_policies_find_its_members():
    result = types.CallToolResult(
        content=[text('{"user_id": "u_1"}')], structured_content={"user_id": "u_1"}, _meta={"trace": "t"}
    )
    recorded = recorded_result(result)
    assert recorded["user_id"] == "u_1"
    assert recorded[MCP_RESULT] == {
        "content": [{"type": "text", "text": '{"user_id": "u_1"}'}],
        "_meta": {"trace": "t"},
        "structured": True,
    }
    assert dumped(result_from_record(recorded)) == dumped(result)


def test_several_blocks_and_non_object_structured_content_round_trip():
    image = types.ImageContent(type="image", data="aGk=", mime_type="image/png")
    result = types.CallToolResult(content=[text("one"), text("two"), image], structured_content=None)
    recorded = recorded_result(result)
    assert recorded["text"] == "one\ntwo"
    assert dumped(result_from_record(recorded)) == dumped(result)


def test_a_structured_result_that_already_uses_the_envelope_name_is_not_merged_into():
    result = types.CallToolResult(content=[text("x")], structured_content={MCP_RESULT: "theirs"})
    recorded = recorded_result(result)
    assert recorded[MCP_RESULT]["structuredContent"] == {MCP_RESULT: "theirs"}
    assert dumped(result_from_record(recorded)) == dumped(result)


@pytest.mark.parametrize(
    "recorded, expected_text, structured",
    [
        ({"user_id": "u_1"}, '{"user_id": "u_1"}', {"user_id": "u_1"}),
        ([1, 2], "[1, 2]", None),
        (None, "null", None),
        # An envelope the agent key wrote by hand that is not an MCP result: answered as JSON text.
        ({MCP_RESULT: {"content": "not a list"}}, '{"saga/mcp": {"content": "not a list"}}', None),
    ],
)
def test_a_result_not_recorded_by_a_gateway_is_answered_as_its_json(recorded, expected_text, structured):
    result = result_from_record(recorded)
    assert result_text(result) == expected_text
    if structured is not None:
        assert result.structured_content == structured


def test_a_tool_error_names_its_run_and_action_only_when_known():
    bare = tool_error("not made")
    assert bare.is_error and result_text(bare) == "not made" and bare.meta is None
    full = tool_error("not made", run_id="run_1", action_id="act_1")
    assert full.meta == {RUN_META: "run_1", ACTION_META: "act_1"}


def test_a_forwarded_result_keeps_its_own_meta_and_gains_the_run_and_action():
    result = types.CallToolResult(content=[text("ok")], _meta={"trace": "t"})
    marked = with_meta(result, run_id="run_1", action_id="act_1")
    assert marked.meta == {"trace": "t", RUN_META: "run_1", ACTION_META: "act_1"}
    assert result.meta == {"trace": "t"}  # a copy: the upstream's result is not changed


@pytest.mark.parametrize(
    "error, starts",
    [
        (SagaUnavailable("down", attempts=3), "Saga Admin could not be reached to record this call"),
        (Paused(409, "paused", "hr.create_user is paused"), "Paused in Saga Admin"),
        (PolicyDenied(403, "policy_denied", "over the limit"), "Denied by a Saga Admin policy"),
        (
            SagaAPIError(400, "invalid_request", "bad args"),
            "Saga Admin refused to record this call (invalid_request)",
        ),
        (SagaError("odd"), "Saga Admin could not record this call"),
    ],
)
def test_every_refusal_says_why_and_that_the_call_was_not_made(error, starts):
    message = refusal(error)
    assert message.startswith(starts) and "not made" in message


def test_a_json_object_as_the_only_text_block_is_recorded_as_that_object_for_result_templates():
    # A server that answers JSON as text (no structured content): $result.<path> finds its
    # members, and a replay answers with the same text and no structured content.
    result = types.CallToolResult(content=[text('{"id": "A-1", "price": 12.5}')], structured_content=None)
    recorded = recorded_result(result)
    assert recorded["price"] == 12.5 and recorded["id"] == "A-1"
    assert recorded[MCP_RESULT] == {"content": [{"type": "text", "text": '{"id": "A-1", "price": 12.5}'}]}
    assert dumped(result_from_record(recorded)) == dumped(result)


@pytest.mark.parametrize("body", ["[1, 2]", '"a string"', "12.5", "not json", '{"saga/mcp": 1}'])
def test_text_that_is_not_a_json_object_stays_text(body):
    result = types.CallToolResult(content=[text(body)], structured_content=None)
    recorded = recorded_result(result)
    assert recorded == body or recorded["text"] == body
    assert dumped(result_from_record(recorded)) == dumped(result)
