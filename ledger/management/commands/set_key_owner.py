from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra import errors
from ledger.audit import Actor
from ledger.models import AgentKey
from ledger.services import keys


class Command(BaseCommand):
    help = (
        "Give a key that has no owner its owner, once: the person behind it. An approver key issued "
        "before keys had owners approves nothing until it has one. An owner is never replaced."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--prefix", required=True, help="The key's prefix, e.g. sk_1a2b3c4d5e6f.")
        parser.add_argument(
            "--owner",
            required=True,
            metavar="USERNAME",
            help="A member of the key's tenant (with the approver or admin role for an approver key).",
        )

    def handle(self, *args: Any, prefix: str, owner: str, **options: Any) -> None:
        key = AgentKey.objects.select_related("tenant").filter(prefix=prefix.strip()).first()
        if key is None:
            raise CommandError(f"No key has the prefix {prefix!r}.")
        person = get_user_model().objects.filter(username=owner.strip()).first()
        if person is None:
            raise CommandError(f"No user is named {owner.strip()!r}.")
        try:
            keys.agent_key_set_owner(key=key, owner=person, actor=Actor.system("set_key_owner"))
        except errors.SagaError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(
            f"Key {key.prefix} ({key.name}, {', '.join(key.scopes)}) of tenant {key.tenant.slug} is now "
            f"owned by {person.get_username()}."
        )
