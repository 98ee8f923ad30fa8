from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import errors
from ledger.audit import Actor
from ledger.services import keys


class Command(BaseCommand):
    help = "Create an API key for a tenant (creating the tenant if needed). The key is printed once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, metavar="SLUG")
        parser.add_argument("--name", required=True, help="What the key is for, e.g. onboarding-agent.")
        parser.add_argument(
            "--scopes", default="agent", help="Comma-separated: agent, operator (default: agent)."
        )

    def handle(self, *args: Any, tenant: str, name: str, scopes: str, **options: Any) -> None:
        scope_list = [part.strip() for part in scopes.split(",") if part.strip()]
        try:
            owner = keys.tenant_get_or_create(slug=tenant)
            issued = keys.agent_key_create(
                tenant=owner, name=name, scopes=scope_list, actor=Actor.system("create_agent_key")
            )
        except errors.SagaError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(
            f"Created key {issued.key.prefix} ({', '.join(issued.key.scopes)}) for tenant {owner.slug}. "
            "It is shown only once; store it now:"
        )
        # Alone on the last line, so scripts can take it with `| tail -n1`.
        self.stdout.write(issued.secret)
