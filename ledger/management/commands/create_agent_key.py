from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from infra import errors
from ledger.audit import Actor
from ledger.services import keys


class Command(BaseCommand):
    help = "Create an API key for a tenant (creating the tenant if needed). The key is printed once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, metavar="SLUG")
        parser.add_argument(
            "--name",
            required=True,
            help="The agent or automation the key is for, e.g. onboarding-agent. Keys with the same "
            "name are the same agent: a new key keeps access to the runs the old one created.",
        )
        parser.add_argument(
            "--scopes",
            default="agent",
            help="Comma-separated: agent (records runs and actions), operator (recovery, and reads "
            "every run of the tenant), approver (approves and rejects). Default: agent. A key never "
            "holds both agent and approver.",
        )
        parser.add_argument(
            "--owner",
            default="",
            metavar="USERNAME",
            help="The person behind the key: a dashboard user who is a member of the tenant. Required "
            "with the approver scope (the user must have the approver or admin role there): their "
            "login and every key they own count as one approver, and none of them grants what they "
            "asked for. Optional otherwise (it names who asks through an agent or operator key).",
        )

    def handle(self, *args: Any, tenant: str, name: str, scopes: str, owner: str, **options: Any) -> None:
        scope_list = [part.strip() for part in scopes.split(",") if part.strip()]
        person = None
        if owner.strip():
            person = get_user_model().objects.filter(username=owner.strip()).first()
            if person is None:
                raise CommandError(
                    f"No user is named {owner.strip()!r}. Create them first: manage.py create_staff "
                    f"{owner.strip()} --password … --tenant {tenant} --role approver."
                )
        try:
            # One transaction: a refused key (unknown scopes, agent with approver, an owner who may
            # not hold it) leaves no new tenant behind either.
            with transaction.atomic():
                holder = keys.tenant_get_or_create(slug=tenant)
                issued = keys.agent_key_create(
                    tenant=holder,
                    name=name,
                    scopes=scope_list,
                    actor=Actor.system("create_agent_key"),
                    owner=person,
                )
        except errors.SagaError as exc:
            raise CommandError(exc.message) from None
        owned = f", owned by {person.get_username()}" if person is not None else ""
        self.stdout.write(
            f"Created key {issued.key.prefix} ({', '.join(issued.key.scopes)}{owned}) for tenant "
            f"{holder.slug}. It is shown only once; store it now:"
        )
        # Alone on the last line, so scripts can take it with `| tail -n1`.
        self.stdout.write(issued.secret)
