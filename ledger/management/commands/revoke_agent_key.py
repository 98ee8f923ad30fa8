from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra import errors
from ledger.audit import Actor
from ledger.models import AgentKey
from ledger.services import keys


class Command(BaseCommand):
    help = "Revoke an API key by its public prefix (sk_…); it stops authenticating immediately."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--prefix", required=True, help="The key's prefix, e.g. sk_1a2b3c4d5e6f.")

    def handle(self, *args: Any, prefix: str, **options: Any) -> None:
        key = AgentKey.objects.select_related("tenant").filter(prefix=prefix.strip()).first()
        if key is None:
            raise CommandError(f"No key has the prefix {prefix!r}.")
        try:
            keys.agent_key_revoke(key=key, actor=Actor.system("revoke_agent_key"))
        except errors.InvalidTransition:
            raise CommandError(
                f"Key {key.prefix} ({key.name}) was already revoked at {key.revoked_at:%Y-%m-%d %H:%M} UTC."
            ) from None
        self.stdout.write(f"Revoked key {key.prefix} ({key.name}) of tenant {key.tenant.slug}.")
