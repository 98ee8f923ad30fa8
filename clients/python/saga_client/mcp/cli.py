"""``saga-mcp``'s command line: the arguments, the environment it reads (``SAGA_API_KEY``,
``SAGA_MCP_TOKEN``, the upstream's header variables), the checks made before anything starts, and
``main``, the console script (``python -m saga_client.mcp`` runs it too)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from urllib.parse import urlsplit

from saga_client.mcp.listener import TOKEN_ENV
from saga_client.mcp.options import (
    DEFAULT_AGENT,
    DEFAULT_APPROVAL_TIMEOUT_S,
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_POLICY_REFRESH_S,
    GatewayError,
    Options,
    is_loopback,
)
from saga_client.mcp.serve import serve


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


POLICY_REFRESH_ENV = "SAGA_MCP_POLICY_REFRESH"


def _policy_refresh(given: float | None, environ: Mapping[str, str]) -> float:
    if given is not None:
        return given
    text = environ.get(POLICY_REFRESH_ENV, "").strip()
    if not text:
        return DEFAULT_POLICY_REFRESH_S
    try:
        return _positive(text)
    except argparse.ArgumentTypeError as exc:
        raise GatewayError(f"saga-mcp: {POLICY_REFRESH_ENV} {exc}.") from None


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
    # No default through `type`: argparse passes a string default to it, and "" is not a namespace.
    p.add_argument("--namespace", type=_namespace, default=None, help="record tool NAME as NS.NAME")
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
        "--policy-refresh",
        type=_positive,
        default=None,
        metavar="SECONDS",
        help="revalidate the tenant's policies (If-None-Match, a 304 when unchanged) at most this often, "
        f"so a policy loaded meanwhile governs calls within it (default: ${POLICY_REFRESH_ENV}, else "
        f"{DEFAULT_POLICY_REFRESH_S:g})",
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
        namespace=args.namespace or "",
        listen=args.listen,
        approval_timeout_s=args.approval_timeout,
        call_timeout_s=args.call_timeout,
        idle_timeout_s=args.idle_timeout,
        upstream_headers=tuple(args.upstream_header),
        heartbeat_s=args.heartbeat_interval,
        poll_interval_s=args.poll_interval,
        policy_refresh_s=_policy_refresh(args.policy_refresh, environ),
        token=token,
    )


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
