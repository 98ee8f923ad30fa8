from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.audit import Actor
from ledger.models import Tenant
from ledger.policies.errors import PolicyFileError
from ledger.policies.load import policies_load_file


class Command(BaseCommand):
    help = (
        "Load tool policies and compensators from a policy file (native or agentSafety layout). "
        "Replaces the policy set of the scope (global, or --tenant): entries no longer in the file "
        "are removed. Atomic (an error changes nothing) and idempotent (a repeat load changes nothing)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="Path to the policy file (JSON).")
        parser.add_argument("--tenant", metavar="SLUG", help="Load for this tenant only (default: global).")

    def handle(self, *args: Any, file: str, tenant: str | None, **options: Any) -> None:
        scope: Tenant | None = None
        if tenant:
            scope = Tenant.objects.filter(slug=tenant).first()
            # Creating a tenant on a typo would hide the mistake: policies would apply to no one.
            if scope is None:
                raise CommandError(f"Tenant {tenant!r} does not exist; nothing was changed.")
        try:
            report = policies_load_file(path=file, tenant=scope, actor=Actor.system("load_policies"))
        except PolicyFileError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Loaded {file} ({report.layout} layout) into the {report.scope} scope: {report.summary()}."
        )
        if report.removed:
            self.stdout.write(
                f"Removed {len(report.removed)} no longer in the file: {', '.join(report.removed)}."
            )
        if not report.changed:
            self.stdout.write("Nothing changed.")
        # The file loads all the same; its author is told now, while the file is in front of them,
        # what will wait for a person or run unattended (docs/SECURITY.md, Residual risk). Every
        # warning on one stream, in one form.
        for warning in report.warnings:
            self.stderr.write(f"Warning: {warning}", style_func=self.style.WARNING)
