from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import errors, staff
from ledger.audit import Actor
from ledger.models import Membership
from ledger.services import keys


class Command(BaseCommand):
    help = (
        "Create or update a dashboard user with a role in a tenant (creating the tenant if needed). "
        "Only the admin role reaches the Django admin."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--password", required=True)
        parser.add_argument("--tenant", required=True, metavar="SLUG")
        parser.add_argument("--role", required=True, choices=Membership.Role.values)
        parser.add_argument("--email", default="")

    def handle(
        self, *args: Any, username: str, password: str, tenant: str, role: str, email: str, **options: Any
    ) -> None:
        try:
            owner = keys.tenant_get_or_create(slug=tenant)
            result = staff.staff_set(
                username=username,
                password=password,
                tenant=owner,
                role=role,
                email=email,
                actor=Actor.system("create_staff"),
            )
        except errors.SagaError as exc:
            raise CommandError(exc.message) from None
        verb = "Created" if result.user_created else "Updated"
        self.stdout.write(
            f"{verb} user {result.user.get_username()}: {role} at {owner.slug}"
            f"{' (Django admin access)' if result.user.is_staff else ''}."
        )
