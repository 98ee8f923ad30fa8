from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.audit import audit_heads_verify, audit_verify


class Command(BaseCommand):
    help = (
        "Check the audit log: every hash chain links up, every event matches its hash, and every "
        "run's chain ends at the head its run row records (its newest events were not deleted). "
        "Exit 1 naming the first problem, else confirm the log is intact."
    )

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
        truncated = audit_heads_verify(chain=chain)
        if truncated:
            for gap in truncated:
                ends = f"event {gap.last_event_id}" if gap.last_event_id else "no event at all"
                owner = f"Run {gap.run_id}" if gap.run_id else f"Chain {gap.chain}"
                self.stderr.write(
                    f"{owner}: its newest audit events are missing (the chain ends at {ends}, "
                    f"but its recorded head is {gap.head[:16]}…)."
                )
            names = ", ".join(f"run {gap.run_id}" if gap.run_id else gap.chain for gap in truncated[:5])
            more = f" and {len(truncated) - 5} more" if len(truncated) > 5 else ""
            raise CommandError(
                f"Audit chain truncated: the newest events of {names}{more} were deleted.", returncode=1
            )
        self.stdout.write(
            "Audit log intact: every chain links up, every event matches its hash and every run's "
            "chain ends at its recorded head."
        )
