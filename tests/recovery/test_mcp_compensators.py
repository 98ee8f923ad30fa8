"""MCP compensators: an unwind step calls a tool on a real MCP server (the SDK's, in a
subprocess) over Streamable HTTP with the step's args, and maps the result to an outcome."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from ledger.audit import Actor
from ledger.models import Compensator
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import policy_file_load, policy_file_parse
from recovery import compensators
from recovery.compensators import CompensationRequest
from tests.support.mcp_servers import http_upstream


def _request(**overrides: Any) -> CompensationRequest:
    fields: dict[str, Any] = dict(
        step_id="stp_1",
        action_id="act_1",
        run_id="run_1",
        tenant="acme",
        tool="hr.delete_user",
        args={"email": "ashu@company.com"},
        target_type="user",
        target_id="ashu@company.com",
        before_snapshot=None,
        after_snapshot=None,
        attempt=1,
        idempotency_key="stp_1",
        timeout_s=10.0,
    )
    fields.update(overrides)
    return CompensationRequest(**fields)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    with http_upstream(tmp_path_factory.mktemp("mcp"), HR_MCP_TOKEN="s3cret-token") as server:
        yield server


AUTH = {"Authorization": "HR_MCP_AUTH"}


def test_it_calls_the_tool_with_the_steps_args_and_keeps_its_structured_result(upstream, monkeypatch):
    monkeypatch.setenv("HR_MCP_AUTH", "Bearer s3cret-token")
    before = len(upstream.calls())
    outcome = compensators.mcp_call(
        url=upstream.url, tool="delete_user", headers_env=AUTH, request=_request(idempotency_key="stp_42")
    )
    assert outcome.kind == "done", outcome.error
    assert outcome.state == {"email": "ashu@company.com", "deleted": False}
    [call] = upstream.calls()[before:]
    assert call["tool"] == "delete_user"
    assert call["args"] == {"email": "ashu@company.com"}
    # The same key on every retry, as the webhook protocol promises.
    assert call["idempotency_key"] == "stp_42"


def test_a_tool_error_fails_the_step_and_keeps_the_servers_message(upstream, monkeypatch):
    monkeypatch.setenv("HR_MCP_AUTH", "Bearer s3cret-token")
    outcome = compensators.mcp_call(
        url=upstream.url,
        tool="assign_license",
        headers_env=AUTH,
        request=_request(args={"email": "nobody@company.com", "sku": "business-plus"}),
    )
    assert outcome.kind == "failed"
    assert "No user nobody@company.com: create the user first." in outcome.error
    assert "assign_license" in outcome.error


def test_an_unknown_tool_is_a_permanent_failure(upstream, monkeypatch):
    monkeypatch.setenv("HR_MCP_AUTH", "Bearer s3cret-token")
    outcome = compensators.mcp_call(
        url=upstream.url, tool="drop_tables", headers_env=AUTH, request=_request()
    )
    assert outcome.kind == "failed"
    assert "drop_tables" in outcome.error


def test_a_missing_header_variable_fails_the_step_without_calling_anything(upstream, monkeypatch):
    monkeypatch.delenv("HR_MCP_AUTH", raising=False)
    before = len(upstream.calls())
    outcome = compensators.mcp_call(
        url=upstream.url, tool="delete_user", headers_env=AUTH, request=_request()
    )
    assert outcome.kind == "failed"
    assert "HR_MCP_AUTH" in outcome.error and "not set" in outcome.error
    assert len(upstream.calls()) == before


def test_a_refused_credential_does_not_reach_the_tool_and_never_shows_the_header(upstream, monkeypatch):
    monkeypatch.setenv("HR_MCP_AUTH", "Bearer wrong-token-value")
    before = len(upstream.calls())
    outcome = compensators.mcp_call(
        url=upstream.url, tool="delete_user", headers_env=AUTH, request=_request()
    )
    assert outcome.kind in ("retry", "failed")
    assert "wrong-token-value" not in outcome.error
    assert len(upstream.calls()) == before


def test_a_dead_endpoint_is_retried():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    outcome = compensators.mcp_call(
        url=f"http://127.0.0.1:{port}/mcp", tool="delete_user", headers_env={}, request=_request()
    )
    assert outcome.kind == "retry"
    # The error names the compensator by its tool, not where it points (viewers read step errors).
    assert "the MCP compensator of hr.delete_user" in outcome.error
    assert "127.0.0.1" not in outcome.error and str(port) not in outcome.error


def test_a_server_that_never_answers_is_retried_after_the_step_timeout():
    # A socket that listens but never accepts: the connection opens, no answer ever comes.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        port = sock.getsockname()[1]
        outcome = compensators.mcp_call(
            url=f"http://user:pw@127.0.0.1:{port}/mcp?token=abc",
            tool="delete_user",
            headers_env={},
            request=_request(timeout_s=1.0),
        )
    assert outcome.kind == "retry"
    assert "Timed out after 1s" in outcome.error
    # Credentials in the configured URL stay out of the step's error.
    assert "pw" not in outcome.error and "token=abc" not in outcome.error


def test_args_that_are_not_an_object_fail_the_step(upstream):
    outcome = compensators.mcp_call(
        url=upstream.url, tool="delete_user", headers_env={}, request=_request(args=[1])
    )
    assert outcome.kind == "failed"
    assert "object" in outcome.error


def test_the_engine_dispatches_a_policy_files_mcp_compensator(db, tenant, upstream, monkeypatch):
    monkeypatch.setenv("HR_MCP_AUTH", "Bearer s3cret-token")
    document = policy_file_parse(
        {
            "compensators": {
                "hr.delete_user": {"mcp": upstream.url, "tool": "delete_user", "headers_env": AUTH}
            }
        }
    )
    policy_file_load(document=document, source="test", tenant=tenant, actor=Actor.system("test"))
    row = Compensator.objects.get(tenant=tenant, tool="hr.delete_user")
    assert (row.kind, row.mcp_tool, row.headers_env) == ("mcp", "delete_user", AUTH)
    assert compensators.compensator_describe(tenant_id=tenant.pk, tool="hr.delete_user") == "mcp"
    outcome = compensators.execute(_request(args={"email": "zoe@company.com"}), tenant_id=tenant.pk)
    assert outcome.kind == "done", outcome.error
    assert upstream.calls()[-1]["args"] == {"email": "zoe@company.com"}


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"mcp": "https://hr.internal/mcp"}, "an mcp compensator needs the tool to call on that server"),
        ({"mcp": "file:///etc/passwd", "tool": "x"}, "mcp: must be an http(s) URL with a host"),
        ({"mcp": "https://h/mcp", "tool": "drop tables"}, "tool: must be an MCP tool name"),
        (
            {"mcp": "https://h/mcp", "tool": "x", "headers_env": {"Host": "H"}},
            "'Host' is set by the MCP transport",
        ),
        (
            {"mcp": "https://h/mcp", "tool": "x", "headers_env": {"X-Key": "not a var"}},
            "environment variable name",
        ),
        ({"mcp": "https://h/mcp", "tool": "x", "headers": {"X-Key": "literal"}}, "headers: unknown key"),
        (
            {"mcp": "https://h/mcp", "tool": "x", "secret_env": "S"},
            "secret and secret_env apply to webhooks only",
        ),
        ({"python": "a.b", "tool": "x"}, "tool and headers_env apply to mcp compensators only"),
        ({"mcp": "https://h/mcp", "python": "a.b", "tool": "x"}, "exactly one of webhook, python or mcp"),
    ],
)
def test_the_loader_names_what_is_wrong_with_an_mcp_compensator(spec, problem):
    with pytest.raises(PolicyFileError) as caught:
        policy_file_parse({"compensators": {"hr.delete_user": spec}})
    [message] = caught.value.problems
    assert message.startswith('compensators["hr.delete_user"]')
    assert problem in message
