from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo import agents, mcp_agent, people
from demo.setup import AGENT_KEYS, agent_secret, compensators_check, demo_setup, logins_table, policy_summary
from demo.views import SECRET_ENV
from ledger.policies.errors import PolicyFileError


class Command(BaseCommand):
    help = (
        "Set up the demo (tenants, demo policies, logins for each role, agent keys, the demo world's "
        "data) and let the demo agents play their scenarios against the running server's API. "
        "Idempotent: scenarios whose run already exists are skipped. --continuous then keeps "
        "producing live traffic and tends runs waiting for approval until stopped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--url",
            default=os.environ.get("SAGA_DEMO_URL", "http://127.0.0.1:8000"),
            help="Where the Saga Admin web process answers (default: %(default)s).",
        )
        parser.add_argument(
            "--continuous", action="store_true", help="After seeding, keep producing runs until interrupted."
        )
        parser.add_argument(
            "--every",
            type=float,
            default=20.0,
            metavar="SECONDS",
            help="With --continuous: seconds between new runs (default: %(default)s).",
        )
        parser.add_argument(
            "--setup-only",
            action="store_true",
            help="Only tenants, policies, logins, keys and world data; no agent runs.",
        )
        parser.add_argument(
            "--no-setup",
            action="store_true",
            help="Skip the setup (make run has just done it with --setup-only): only the agents' runs.",
        )
        parser.add_argument(
            "--mcp-url",
            default=os.environ.get("SAGA_DEMO_MCP_URL", ""),
            metavar="URL",
            help="Where the demo MCP server (clients/python/examples/hr_workspace_mcp.py) answers: the "
            "people.* tools' MCP compensators call it (default: $SAGA_DEMO_MCP_URL, else the address "
            "demo/policies/native.json names).",
        )
        parser.add_argument(
            "--mcp-gateway",
            default="",
            metavar="URL",
            help="A saga-mcp gateway in front of that server (--namespace people, --agent "
            f"{mcp_agent.AGENT}, the demo-mcp-gateway key): the demo's MCP agent plays its session "
            "through it.",
        )
        parser.add_argument(
            "--print-key",
            choices=sorted(AGENT_KEYS),
            metavar="AGENT",
            help="Print the API key of one demo agent (minting it if needed) and exit: make run hands "
            "the MCP gateway its key through the environment this way. One of: %(choices)s.",
        )
        parser.add_argument("--print-logins", action="store_true", help="Print the demo logins and exit.")

    def handle(
        self,
        *args: Any,
        url: str,
        continuous: bool,
        every: float,
        setup_only: bool,
        no_setup: bool,
        mcp_url: str,
        mcp_gateway: str,
        print_key: str | None,
        print_logins: bool,
        **options: Any,
    ) -> None:
        if print_logins:
            self._print_logins()
            return
        if print_key:
            self.stdout.write(agent_secret(print_key))
            return
        # The agents' HTTP clients log every request at INFO; the seed's own lines tell the story.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        logging.getLogger("httpx2").setLevel(logging.WARNING)
        logging.getLogger("mcp").setLevel(logging.WARNING)
        url = url.rstrip("/")
        self._setup(url, mcp_url, setup_only=setup_only, skip=no_setup)
        if setup_only:
            return

        secret = os.environ.get(SECRET_ENV, "")
        if not secret:
            raise CommandError(
                f"{SECRET_ENV} is not set: the demo world refuses unsigned calls "
                "(make run sets it; the web and worker processes need the same value)."
            )
        keys = {AGENT_KEYS[name][0]: agent_secret(name) for name in ("acme-agents", "globex-agents")}
        demo = agents.Demo(base_url=url, keys=keys, world=agents.World(url, secret), people=people)
        try:
            report = agents.seed(demo, log=self.stdout.write)
            self.stdout.write(f"Demo runs: {len(report.played)} played, {len(report.skipped)} already there.")
            if mcp_gateway:
                played = mcp_agent.seed_session(
                    base_url=url,
                    key=agent_secret("acme-mcp-gateway"),
                    gateway_url=mcp_gateway,
                    log=self.stdout.write,
                )
                if played is None:
                    self.stdout.write("Demo MCP session: already there.")
                promoted = mcp_agent.seed_promotion_session(
                    base_url=url,
                    key=agent_secret("acme-mcp-gateway"),
                    gateway_url=mcp_gateway,
                    log=self.stdout.write,
                )
                if promoted is None:
                    self.stdout.write("Demo MCP promotion session: already there.")
            if not continuous:
                # Now that everything they call is up: no demo compensator shows "never checked".
                self.stdout.write(f"Demo compensators: {compensators_check()}")
                self._print_logins()
            if continuous:
                self._continuous(demo, every)
        finally:
            demo.close()

    def _setup(self, url: str, mcp_url: str, *, setup_only: bool, skip: bool) -> None:
        """The demo setup, unless ``skip`` (--no-setup: make run's --setup-only step has just
        done it)."""
        if setup_only and skip:
            raise CommandError("--setup-only and --no-setup ask for opposite things; give one.")
        if skip:
            return
        try:
            setup = demo_setup(base_url=url, mcp_url=mcp_url)
        except PolicyFileError as exc:
            raise CommandError(f"{exc} (is --mcp-url / SAGA_DEMO_MCP_URL an http(s) URL?)") from None
        self.stdout.write(f"Demo policies: {policy_summary(setup.policy_reports)}")

    def _print_logins(self) -> None:
        self.stdout.write("Demo logins (dashboard at /, Django admin at /admin/):")
        self.stdout.write(logins_table())

    def _continuous(self, demo: agents.Demo, every: float) -> None:
        stop = threading.Event()
        # SIGTERM (make run's Ctrl-C, a process manager) ends the loop between two runs.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(
            f"Live demo traffic: a run every {every:g}s, about 1 in 5 of them failing into the recovery "
            "queue (a failed onboarding or a caught wrong-record update); Ctrl-C to stop."
        )
        agents.continuous(demo, every_s=every, stop=stop, log=lambda line: self.stdout.write(f"  {line}"))
