from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.models import Tenant
from recovery.archive import runner


class Command(BaseCommand):
    help = (
        "Archive now what the worker archives periodically: the runs closed (succeeded, compensated, "
        "closed, cancelled) longer than their tenant's audit.retention window are written with "
        "everything that references them and their whole audit chain to the retention's archive "
        "(JSON lines and a manifest signed with SAGA_AUDIT_KEY), then removed from PostgreSQL. A "
        "run with anything open is left and said why. --dry-run lists and changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="One tenant only (its slug).")
        parser.add_argument(
            "--dry-run", action="store_true", help="Say what would be archived; change nothing."
        )
        parser.add_argument(
            "--limit", type=int, help="At most this many runs (default SAGA_ARCHIVE_BATCH, 200)."
        )

    def handle(
        self, *args: Any, tenant: str | None, dry_run: bool, limit: int | None, **options: Any
    ) -> None:
        if limit is not None and limit < 1:
            raise CommandError("--limit must be at least 1; nothing was archived.")
        scope = None
        if tenant is not None:
            scope = Tenant.objects.filter(slug=tenant).first()
            if scope is None:
                raise CommandError(f"No tenant with slug {tenant!r}; nothing was archived.")
        try:
            result = runner.runs_archive(tenant=scope, dry_run=dry_run, limit=limit)
        except runner.ArchiveNotConfigured as exc:
            raise CommandError(str(exc)) from None
        verb = "would archive" if dry_run else "archived"
        for outcome in result.archived:
            self.stdout.write(f"{verb} {outcome.run_id} (tenant {outcome.tenant}): {outcome.detail}")
        for outcome in result.skipped:
            self.stdout.write(f"left {outcome.run_id} (tenant {outcome.tenant}): {outcome.detail}")
        for error in result.errors:
            self.stderr.write(error)
        summary = f"{len(result.archived)} run{'s' if len(result.archived) != 1 else ''} {verb}, {len(result.skipped)} left"
        self.stdout.write(summary + (" (dry run: nothing was changed)." if dry_run else "."))
        if result.errors:
            raise CommandError(
                f"{len(result.errors)} tenant(s) could not be archived; the first: {result.errors[0]}"
            )
