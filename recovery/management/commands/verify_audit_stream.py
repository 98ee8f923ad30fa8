from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra.env import env_secret
from recovery.audit_stream import records


class Command(BaseCommand):
    help = (
        "Check what a SIEM received from the audit stream (one sink's messages, a file of lines: the "
        "JSON messages, HEC events or RFC 5424 lines): per tenant, every seq from 1 without gaps "
        "(duplicates removed by event id), and every chain head's HMAC signature (SAGA_AUDIT_KEY or "
        "SAGA_AUDIT_KEY_FILE) and digest over the events up to its position. Exit 1 naming each "
        "problem. Needs no database."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="The received messages, one per line ('-': standard input).")

    def handle(self, *args: Any, file: str, **options: Any) -> None:
        key = env_secret("SAGA_AUDIT_KEY")
        if not key:
            raise CommandError(
                "Set SAGA_AUDIT_KEY (or SAGA_AUDIT_KEY_FILE): the key the chain heads are signed with."
            )
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{file}: cannot be read ({exc}).") from None
        messages = []
        for number, line in enumerate(text.splitlines(), start=1):
            try:
                message = records.parse_message(line)
            except ValueError as exc:
                raise CommandError(f"{file}, line {number}: not a message ({exc}).") from None
            if message is not None:
                messages.append(message)
        report = records.verify_stream(messages, key.encode())
        for tenant, count in sorted(report.events.items()):
            heads = report.heads_verified.get(tenant, 0)
            self.stdout.write(f"{tenant}: {count} events, {heads} signed chain heads verified.")
        if report.problems:
            for problem in report.problems:
                self.stderr.write(problem)
            raise CommandError(
                f"The audit stream is not whole: {len(report.problems)} problem(s).", returncode=1
            )
        if not any(report.heads_verified.values()):
            raise CommandError(
                "No signed chain head in the file: nothing proves the stream whole.", returncode=1
            )
        self.stdout.write(
            "Audit stream whole: every event present in order, every chain head signed and matching."
        )
