from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra.conf import saga
from infra.durations import duration_words
from ledger import pruning
from ledger.services import idempotency
from recovery.notifications import prune as notifications


class Command(BaseCommand):
    help = (
        "Prune what the worker prunes hourly, now: Idempotency-Key records older than "
        "SAGA_IDEMPOTENCY_RETENTION (7d) that no live action still needs, and delivered, dropped "
        "or failed notifications older than SAGA_NOTIFICATION_RETENTION (30d); never one still to "
        "be sent. Deletes in short batches (safe beside the worker, and beside another prune); "
        "--dry-run counts and changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--dry-run", action="store_true", help="Say how many rows would go; delete nothing."
        )
        parser.add_argument(
            "--only", choices=["idempotency", "notifications"], help="Prune one store (default: both)."
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=pruning.BATCH,
            help=f"Rows per DELETE statement (default {pruning.BATCH}, at most {pruning.MAX_BATCH}).",
        )

    def handle(self, *args: Any, dry_run: bool, only: str | None, batch_size: int, **options: Any) -> None:
        if not 1 <= batch_size <= pruning.MAX_BATCH:
            raise CommandError(f"--batch-size must be between 1 and {pruning.MAX_BATCH}; nothing was pruned.")
        config = saga()
        stores = [
            (
                "idempotency",
                "Idempotency-Key records",
                config.idempotency_retention_s,
                idempotency.idempotency_prune,
            ),
            (
                "notifications",
                "finished notifications",
                config.notification_retention_s,
                notifications.notifications_prune,
            ),
        ]
        for name, what, window_s, prune in stores:
            if only and only != name:
                continue
            count = prune(batch_size=batch_size, dry_run=dry_run)
            verb = "would be deleted (dry run: nothing was)" if dry_run else "deleted"
            self.stdout.write(f"{what} older than {duration_words(window_s)}: {count} {verb}")
