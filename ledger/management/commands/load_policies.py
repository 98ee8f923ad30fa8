from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.audit import Actor
from ledger.models import Tenant
from ledger.policy_loader import PolicyFileError, policies_load_file
from ledger.upstreams import policy_upstream_mismatches


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
        # A compensation that cannot reach the upstream its tool was performed on waits for a
        # person every time: say so now, while the file is in front of whoever loads it.
        for checked in [scope] if scope is not None else Tenant.objects.order_by("slug"):
            for mismatch in policy_upstream_mismatches(tenant=checked):
                self.stderr.write(f"Warning ({checked.slug}): {mismatch['message']}")
        self._warn_compensations(report.compensation_warnings)

    def _warn_compensations(self, warnings: list[str]) -> None:
        # The residual risk of compensations built from what agents report (docs/SECURITY.md):
        # the file loads, but its author is told which compensating tools run unattended.
        for warning in warnings:
            self.stdout.write(self.style.WARNING(f"Warning: {warning}"))
