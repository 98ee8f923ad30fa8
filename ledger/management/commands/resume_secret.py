from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import outbound
from ledger.models import Tenant


class Command(BaseCommand):
    help = (
        "Print the secret that signs the resume/cancel commands pushed to one tenant's resume_urls "
        "(derived from SAGA_RESUME_WEBHOOK_SECRET), alone on the last line, for that tenant's agents "
        "to verify pushes with saga_client.verify_signature."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="The tenant's slug.")

    def handle(self, *args: Any, tenant: str, **options: Any) -> None:
        owner = Tenant.objects.filter(slug=tenant.strip()).first()
        if owner is None:
            raise CommandError(f"No tenant has the slug {tenant!r}.")
        secret = outbound.resume_secret(owner)
        if not secret:
            raise CommandError(
                "SAGA_RESUME_WEBHOOK_SECRET is not set: commands are pushed unsigned. Set it (the same "
                "value for the web and worker processes) to give each tenant a signing secret."
            )
        # Printed, never logged: it is for the operator to hand to this tenant's agents only.
        self.stdout.write(
            f"Signing secret for commands pushed to tenant {owner.slug}'s resume URLs "
            "(it changes when SAGA_RESUME_WEBHOOK_SECRET does):"
        )
        self.stdout.write(secret)
