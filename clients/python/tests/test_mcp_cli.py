"""saga-mcp's command line and options, without starting anything: the key only from the
environment, the checks made before anything starts, tool names under a namespace, how the
upstream is written in runs and reached."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp")

from mcp import StdioServerParameters  # noqa: E402

from saga_client.mcp.cli import options_from  # noqa: E402
from saga_client.mcp.listener import TOKEN_ENV  # noqa: E402
from saga_client.mcp.options import GatewayError, Options, is_loopback  # noqa: E402
from saga_client.mcp.serve import describe_upstream, is_url, upstream_target  # noqa: E402

BASE = ["--saga-url", "http://127.0.0.1:8000", "--upstream", "http://127.0.0.1:8765/mcp"]
KEY = {"SAGA_API_KEY": "sk_test"}


def test_the_key_comes_from_the_environment_and_the_rest_from_the_flags():
    options = options_from([*BASE, "--namespace", "hr", "--agent", "onboarding"], KEY)
    assert (options.api_key, options.namespace, options.agent) == ("sk_test", "hr", "onboarding")
    assert options.listen is None and options.token == ""


def test_without_a_key_in_the_environment_it_refuses_to_start():
    with pytest.raises(GatewayError, match="SAGA_API_KEY is not set") as refused:
        options_from([*BASE, "--namespace", "hr"], {"SAGA_API_KEY": "  "})
    assert refused.value.status == 2


def test_an_upstream_header_must_name_a_variable_that_is_set():
    argv = [*BASE, "--namespace", "hr", "--upstream-header", "Authorization=HR_MCP_AUTH"]
    with pytest.raises(GatewayError, match="reads HR_MCP_AUTH from the environment"):
        options_from(argv, KEY)
    options = options_from(argv, {**KEY, "HR_MCP_AUTH": "Bearer t"})
    assert options.upstream_headers == (("Authorization", "HR_MCP_AUTH"),)


def test_the_saga_url_must_be_http():
    with pytest.raises(GatewayError, match="must be an http"):
        options_from(["--saga-url", "ftp://saga", "--upstream", "x", "--namespace", "hr"], KEY)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "saga.example.com"])
def test_a_listener_beyond_loopback_needs_a_token(host):
    argv = [*BASE, "--namespace", "hr", "--listen", f"{host}:8766"]
    with pytest.raises(GatewayError, match=TOKEN_ENV):
        options_from(argv, KEY)
    options = options_from(argv, {**KEY, TOKEN_ENV: "secret"})
    assert options.listen == (host, 8766) and options.token == "secret"
    assert "secret" not in repr(options)


@pytest.mark.parametrize("listen", ["127.0.0.1:8766", "localhost:8766", "[::1]:8766"])
def test_a_loopback_listener_needs_no_token(listen):
    options = options_from([*BASE, "--namespace", "hr", "--listen", listen], KEY)
    assert options.listen is not None and options.listen[1] == 8766 and options.token == ""


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--listen", "8766"),
        ("--listen", "127.0.0.1:99999"),
        ("--namespace", ".hr"),
        ("--namespace", "h r"),
        ("--approval-timeout", "0"),
        ("--call-timeout", "nan"),
        ("--idle-timeout", "-5"),
        ("--upstream-header", "Authorization"),
    ],
)
def test_malformed_flags_are_refused_by_the_parser(flag, value, capsys):
    with pytest.raises(SystemExit) as exited:
        options_from([*BASE, "--namespace", "hr", flag, value], KEY)
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


def test_a_namespace_prefixes_the_recorded_tool_name_and_loses_a_trailing_dot():
    options = options_from([*BASE, "--namespace", "hr."], KEY)
    assert options.namespace == "hr"
    assert options.recorded_name("create_user") == "hr.create_user"
    assert Options(saga_url="u", api_key="k", upstream="x").recorded_name("create_user") == "create_user"


def test_without_a_namespace_tools_are_recorded_under_their_own_names():
    """docs/MCP.md calls --namespace optional: without it the gateway starts (it exited 2 with
    "must be a tool-name prefix… got ''", argparse having passed the empty default to the check)."""
    options = options_from(BASE, KEY)
    assert options.namespace == ""
    assert options.recorded_name("create_user") == "create_user"


def test_an_empty_namespace_given_on_the_command_line_is_still_refused(capsys):
    with pytest.raises(SystemExit) as exited:
        options_from([*BASE, "--namespace", ""], KEY)
    assert exited.value.code == 2
    assert "--namespace" in capsys.readouterr().err


def test_loopback_is_localhost_or_a_loopback_address_and_nothing_else():
    assert all(is_loopback(h) for h in ("localhost", "LOCALHOST", "127.0.0.1", "127.5.5.5", "::1"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "myhost", "localhost.example.com"))


def test_an_upstream_is_written_without_credentials_or_query():
    assert describe_upstream("https://user:pw@hr.internal:8443/mcp?token=x") == "https://hr.internal:8443/mcp"
    assert describe_upstream("http://hr.internal/mcp") == "http://hr.internal/mcp"
    assert describe_upstream("/usr/bin/python examples/hr.py --secret s") == "python examples/hr.py"
    assert describe_upstream("") == ""


def test_a_stdio_upstream_is_started_without_the_gateways_secrets():
    environ = {"SAGA_API_KEY": "sk", TOKEN_ENV: "t", "PATH": "/bin", "HR_DB": "db"}
    target = upstream_target("python server.py --port 1", environ)
    assert isinstance(target, StdioServerParameters)
    assert (target.command, target.args) == ("python", ["server.py", "--port", "1"])
    assert target.env == {"PATH": "/bin", "HR_DB": "db"}
    assert upstream_target("http://hr.internal/mcp", environ).url == "http://hr.internal/mcp"
    assert is_url("https://x") and not is_url("python server.py")
    with pytest.raises(GatewayError, match="--upstream is empty"):
        upstream_target("   ", environ)


def test_the_policy_refresh_comes_from_the_flag_else_the_environment_else_five_seconds():
    assert options_from([*BASE], KEY).policy_refresh_s == 5.0
    assert options_from([*BASE], {**KEY, "SAGA_MCP_POLICY_REFRESH": "30"}).policy_refresh_s == 30.0
    flagged = options_from([*BASE, "--policy-refresh", "0.5"], {**KEY, "SAGA_MCP_POLICY_REFRESH": "30"})
    assert flagged.policy_refresh_s == 0.5


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_policy_refresh_in_the_environment_that_is_not_a_positive_number_is_refused(value):
    with pytest.raises(GatewayError, match="SAGA_MCP_POLICY_REFRESH"):
        options_from([*BASE], {**KEY, "SAGA_MCP_POLICY_REFRESH": value})
