from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra import errors
from ledger import bootstrap
from ledger.services import keys


class Command(BaseCommand):
    help = (
        "Create the first tenant, its admin, API keys and the policies from SAGA_BOOTSTRAP_* variables "
        "and the files they name (docs/API.md, Operating contract). Idempotent: what exists is left "
        "as it is, so it runs on every deploy; a refusal changes nothing. Without any "
        "SAGA_BOOTSTRAP_* variable it does nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--print-new-key",
            action="store_true",
            help="Print fresh key material for a keys file's secret_file and exit; the database is not touched.",
        )

    def handle(self, *args: Any, print_new_key: bool, **options: Any) -> None:
        if print_new_key:
            self.stdout.write(keys.agent_key_new_secret())
            return
        try:
            inputs = bootstrap.bootstrap_inputs()
            if inputs.empty:
                self.stdout.write("No SAGA_BOOTSTRAP_* variable is set: nothing to bootstrap.")
                return
            report = bootstrap.bootstrap_apply(inputs, may_print=self.stdout.isatty())
        except bootstrap.BootstrapError as exc:
            raise CommandError(self._refusal(exc.problems)) from None
        except errors.SagaError as exc:
            raise CommandError(self._refusal([exc.message])) from None
        for line in report.lines:
            self.stdout.write(line)
        for warning in report.warnings:
            self.stderr.write(f"Warning: {warning}", style_func=self.style.WARNING)
        self.stdout.write("Bootstrap done." if report.changed else "Nothing changed.")
        # Each issued key alone on its line after its announcement, as create_agent_key prints it.
        # Only to a terminal: elsewhere they went to SAGA_BOOTSTRAP_ISSUED_KEYS_FILE, or the run
        # was refused (``bootstrap._hand_over_issued``).
        for key in report.issued:
            self.stdout.write(f"{key.created}. It is shown only once; store it now:")
            self.stdout.write(key.secret)

    @staticmethod
    def _refusal(problems: list[str]) -> str:
        if len(problems) == 1:
            return f"Bootstrap refused, nothing was changed: {problems[0]}"
        return "Bootstrap refused, nothing was changed:\n" + "\n".join(f"- {p}" for p in problems)
