from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.audit import audit_verify


class Command(BaseCommand):
    help = "Check the audit log's hash chains; report the first broken link (exit 1) or confirm it is intact."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--chain", help="Check one chain only (run:<id> or tenant:<pk>).")

    def handle(self, *args: Any, chain: str | None, **options: Any) -> None:
        checked, broken = audit_verify(chain=chain)
        self.stdout.write(f"{checked} event{'s' if checked != 1 else ''} checked.")
        if broken is not None:
            # A CommandError makes manage.py exit with status 1, which monitoring can alert on.
            raise CommandError(
                f"Audit chain broken: chain {broken.chain}, event {broken.event_id}: {broken.problem}.",
                returncode=1,
            )
        self.stdout.write("Audit log intact: every chain links up and every event matches its hash.")
