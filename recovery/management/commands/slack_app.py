"""``manage.py slack_app --tenant SLUG --signing-secret-env NAME``: connect (or re-key) a tenant's
Slack app without a browser. The secret is read from the environment variable NAME, never from
the command line (where ``ps`` and shell history would keep it), and is never printed. Such a
secret is the tenant's (its admins may know it), so a press only asks.

``--installation-app`` connects the tenant to the installation's own Slack app instead, whose
secret only the operator holds (``SAGA_SLACK_SIGNING_SECRET``): a press then decides."""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra import errors
from ledger.audit import Actor
from ledger.models import Tenant
from recovery.actions import channels


class Command(BaseCommand):
    help = (
        "Connect a tenant's Slack app (its signing secret, read from an environment variable), "
        "or disconnect it with --remove. The secret is write-only: nothing shows it again."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, metavar="SLUG")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument(
            "--signing-secret-env",
            metavar="NAME",
            help="The environment variable holding the Slack app's Signing Secret.",
        )
        which.add_argument(
            "--installation-app",
            action="store_true",
            help="Use the installation's own Slack app (SAGA_SLACK_SIGNING_SECRET): presses decide.",
        )
        which.add_argument("--remove", action="store_true", help="Disconnect the tenant's Slack app.")

    def handle(
        self,
        *args: Any,
        tenant: str,
        signing_secret_env: str | None,
        installation_app: bool,
        remove: bool,
        **options: Any,
    ) -> None:
        owner = Tenant.objects.filter(slug=tenant).first()
        if owner is None:
            raise CommandError(f"No tenant {tenant!r}.")
        actor = Actor.system("manage.py slack_app")
        if remove:
            removed = channels.slack_app_remove(tenant=owner, actor=actor)
            self.stdout.write(
                f"Disconnected the Slack app of {owner.slug}."
                if removed
                else f"{owner.slug} had no Slack app."
            )
            return
        if installation_app:
            try:
                channels.slack_app_use_installation(tenant=owner, actor=actor)
            except errors.SagaError as exc:
                raise CommandError(exc.message) from None
            self.stdout.write(
                f"Connected {owner.slug} to the installation's Slack app (SAGA_SLACK_SIGNING_SECRET): "
                "presses decide. Every earlier Slack link was removed."
            )
            return
        assert signing_secret_env is not None
        secret = os.environ.get(signing_secret_env, "")
        if not secret.strip():
            raise CommandError(f"The environment variable {signing_secret_env} is not set or empty.")
        try:
            channels.slack_app_set(tenant=owner, actor=actor, signing_secret=secret)
        except errors.SagaError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(
            f"Connected the Slack app of {owner.slug} (signing secret from ${signing_secret_env}; it is "
            "never shown). Presses ask; each person confirms in the dashboard. Every earlier Slack "
            "link was removed."
        )
