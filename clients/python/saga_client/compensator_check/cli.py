"""``saga-compensator-check``: run the compensator protocol's cases against a compensator.

    saga-compensator-check URL --secret-env NAME [--request FILE] [--state-url URL]
                           [--timeout S] [--calls N] [--harmless-only] [--json]
    saga-compensator-check --mcp URL --tool NAME [--args JSON|@FILE] [--header NAME=ENV]
    saga-compensator-check --reader URL --secret-env NAME [--request FILE] [--state-url URL]

``--reader`` checks a webhook reader (a policy file's ``readers``) instead of a compensator: its
``--request`` file holds the sample read (``tool``, ``args`` and, optionally, ``path``).

It sends real calls: point it at a staging compensator. Exit 0 when every required case passed,
1 when one did not, 2 for a usage error."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from saga_client.compensator_check import cases, report
from saga_client.compensator_check.reader import run_reader
from saga_client.compensator_check.webhook import Result, Target, run_webhook


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="saga-compensator-check",
        description="Check a compensator against Saga Admin's webhook protocol (real calls: use staging).",
    )
    parser.add_argument("url", nargs="?", help="the compensator's URL (a webhook compensator)")
    parser.add_argument(
        "--secret-env", metavar="NAME", help="the environment variable holding the compensator's secret"
    )
    parser.add_argument("--secret-file", metavar="PATH", help="or a file holding it")
    parser.add_argument(
        "--request",
        metavar="FILE",
        help="a JSON object with the sample step's fields (tool, args, target_type, target_id, "
        "before_snapshot, after_snapshot): a step the compensator can really undo",
    )
    parser.add_argument(
        "--state-url",
        metavar="URL",
        help="a URL answering the target's state (signed GET), to check 'no effect'",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="the step timeout in force, seconds (SAGA_WEBHOOK_TIMEOUT_S; 10)",
    )
    parser.add_argument("--calls", type=int, default=20, help="calls for the latency case (20)")
    parser.add_argument(
        "--harmless-only", action="store_true", help="only the cases that never send a validly signed call"
    )
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    parser.add_argument(
        "--mcp", metavar="URL", help="check an MCP compensator on this MCP server (Streamable HTTP)"
    )
    parser.add_argument("--tool", help="the MCP compensating tool's name (with --mcp)")
    parser.add_argument(
        "--reader",
        metavar="URL",
        help="check a webhook reader at this URL (its --request file: the read's tool, args and path)",
    )
    parser.add_argument("--args", help="the compensation args (with --mcp): a JSON object, or @FILE")
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME=ENV",
        help="an HTTP header for the MCP server, its value read from ENV",
    )
    return parser


def _secret(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str:
    if args.secret_env and args.secret_file:
        parser.error("give --secret-env or --secret-file, not both")
    if args.secret_file:
        try:
            with open(args.secret_file, encoding="utf-8") as handle:
                secret = handle.read().rstrip("\r\n")
        except OSError as exc:
            parser.error(f"--secret-file: {exc.strerror}: {args.secret_file}")
    elif args.secret_env:
        secret = os.environ.get(args.secret_env, "")
        if not secret:
            parser.error(f"--secret-env: {args.secret_env} is not set or empty")
    elif args.harmless_only:
        secret = ""
    else:
        parser.error("the compensator's secret is needed: --secret-env NAME or --secret-file PATH")
    return secret


def _sample(path: str | None, parser: argparse.ArgumentParser) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            sample = json.load(handle)
    except OSError as exc:
        parser.error(f"--request: {exc.strerror}: {path}")
    except ValueError as exc:
        parser.error(f"--request: not JSON: {exc}")
    if not isinstance(sample, dict):
        parser.error("--request: the file must hold a JSON object")
    return sample


def _mcp(args: argparse.Namespace, parser: argparse.ArgumentParser, spec: cases.Spec) -> list[Result]:
    try:
        from saga_client.compensator_check.mcp import McpTarget, args_from, run_mcp
    except ImportError:  # pragma: no cover - the extra is missing
        parser.error("--mcp needs the mcp extra: pip install 'saga-admin-client[mcp]'")
    if not args.tool:
        parser.error("--mcp needs --tool NAME")
    headers = {}
    for item in args.header:
        name, _, env = item.partition("=")
        if not name or not env:
            parser.error(f"--header {item!r}: write NAME=ENV")
        if not os.environ.get(env):
            parser.error(f"--header {name}: {env} is not set or empty")
        headers[name] = os.environ[env]
    try:
        tool_args = args_from(args.args)
    except (OSError, ValueError) as exc:
        parser.error(f"--args: {exc}")
    target = McpTarget(url=args.mcp, tool=args.tool, args=tool_args, headers=headers, timeout_s=args.timeout)
    return run_mcp(target, spec, harmless_only=args.harmless_only)


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.timeout <= 0 or args.calls < 1:
        parser.error("--timeout must be positive and --calls at least 1")
    spec = cases.load()
    if sum(bool(where) for where in (args.url, args.mcp, args.reader)) > 1:
        parser.error("give one of a webhook URL, --mcp URL or --reader URL")
    if args.mcp:
        results = _mcp(args, parser, spec)
    elif args.reader:
        if not args.reader.lower().startswith(("http://", "https://")):
            parser.error(f"not an http(s) URL: {args.reader}")
        reader = Target(
            url=args.reader,
            secret=_secret(args, parser),
            sample=_sample(args.request, parser),
            state_url=args.state_url,
            timeout_s=args.timeout,
        )
        results = run_reader(reader, spec, harmless_only=args.harmless_only)
    else:
        if not args.url:
            parser.error("the compensator's URL is needed (or --mcp URL --tool NAME, or --reader URL)")
        if not args.url.lower().startswith(("http://", "https://")):
            parser.error(f"not an http(s) URL: {args.url}")
        target = Target(
            url=args.url,
            secret=_secret(args, parser),
            sample=_sample(args.request, parser),
            state_url=args.state_url,
            timeout_s=args.timeout,
            calls=args.calls,
        )
        results = run_webhook(target, spec, harmless_only=args.harmless_only)
    if args.json:
        print(report.as_json(results))
    else:
        print(report.table(results))
        print()
        print(report.summary(results))
    sys.exit(report.exit_status(results))


if __name__ == "__main__":
    main()
