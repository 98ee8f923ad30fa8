from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import resume_secrets
from ledger.models import AgentKey, Tenant


class Command(BaseCommand):
    help = (
        "Print the secret that signs the resume/cancel commands pushed to one agent's resume_urls "
        "(per tenant and agent name, derived from SAGA_RESUME_WEBHOOK_SECRET), alone on the last "
        "line, for that agent to verify pushes with saga_client.verify_signature."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant's slug.")
        parser.add_argument(
            "--agent",
            required=True,
            help="The agent's name: the --name its API keys were issued with (create_agent_key).",
        )

    def handle(self, *args: Any, tenant: str, agent: str, **options: Any) -> None:
        owner = Tenant.objects.filter(slug=tenant.strip()).first()
        if owner is None:
            raise CommandError(f"No tenant has the slug {tenant!r}.")
        # Key names are stored stripped (create_agent_key), so the name is compared the same way.
        name = agent.strip()
        if not name:
            raise CommandError("--agent needs the agent's name (the --name of its keys).")
        secret = resume_secrets.resume_secret(owner, name)
        if not secret:
            raise CommandError(
                "SAGA_RESUME_WEBHOOK_SECRET is not set: commands are pushed unsigned. Set it (the same "
                "value for the web and worker processes) to give each agent a signing secret."
            )
        if not AgentKey.objects.filter(tenant=owner, name=name).exists():
            # Not an error (its keys may come later), but most likely a typo worth seeing.
            self.stderr.write(f"Note: no key of tenant {owner.slug} has the name {name!r} yet.")
        # Printed, never logged: it is for the operator to hand to this one agent only.
        self.stdout.write(
            f"Signing secret for commands pushed to agent {name!r} of tenant {owner.slug} "
            "(it changes when SAGA_RESUME_WEBHOOK_SECRET does):"
        )
        self.stdout.write(secret)
