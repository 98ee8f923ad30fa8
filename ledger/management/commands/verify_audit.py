from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from infra.conf import saga
from ledger.archive.destinations import DestinationError, destination_parse
from ledger.archive.storage import StorageError, storage_for
from ledger.archive.verify import archives_verify
from ledger.audit import audit_heads_verify
from ledger.audit_signing import audit_verify_signed, signing_key


class Command(BaseCommand):
    help = (
        "Check the audit log: every hash chain links up, every event matches its hash, and every "
        "run's chain ends at the head its run row records (its newest events were not deleted), and "
        "every signed chain head (SAGA_AUDIT_KEY) is still a prefix of its chain with a signature "
        "that verifies; a run retention archived left its archive record, its tenant's run.archived "
        "event and the head signed when it was archived, all in agreement, and nothing else behind "
        "(a run chain gone without them is a deleted run). Exit 1 naming the problems, else confirm "
        "the log is intact; events after their chain's last signed head are reported as not yet signed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--chain", help="Check one chain only (run:<id> or tenant:<pk>).")
        parser.add_argument(
            "--archive",
            metavar="URL",
            help="Check the runs archived under URL (s3://bucket/prefix or file:///path) instead, offline: "
            "every manifest's signature (SAGA_AUDIT_KEY), its records' SHA-256 and line count, and each "
            "run's audit chain recomputed to the signed head. Reads nothing from the database.",
        )

    def handle(self, *args: Any, chain: str | None, archive: str | None, **options: Any) -> None:
        if archive is not None:
            self._verify_archive(archive)
            return
        report = audit_verify_signed(chain=chain)
        checked, broken = report.checked, report.broken
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
        if report.problems:
            for problem in report.problems:
                self.stderr.write(problem + ".")
            raise CommandError(
                f"Signed audit heads: {len(report.problems)} problem{'s' if len(report.problems) != 1 else ''}, "
                f"the first: {report.problems[0]}.",
                returncode=1,
            )
        self._report_signing(
            report.key_set, report.heads_verified, report.unsigned_events, report.unsigned_chains
        )
        if report.archived_runs:
            self.stdout.write(
                f"{report.archived_runs} archived run{'s' if report.archived_runs != 1 else ''} checked: "
                "archive record, run.archived event and the head signed when archived agree, nothing left behind."
            )
        self.stdout.write(
            "Audit log intact: every chain links up, every event matches its hash and every run's "
            "chain ends at its recorded head."
        )

    def _report_signing(self, key_set: bool, verified: int, unsigned: int, chains: int) -> None:
        if not key_set:
            self.stdout.write(
                "Chain heads unsigned: SAGA_AUDIT_KEY (or SAGA_AUDIT_KEY_FILE) is not set, so no head is "
                "signed and no signature was checked."
            )
            return
        self.stdout.write(f"{verified} signed head{'s' if verified != 1 else ''} verified.")
        if unsigned:
            self.stdout.write(
                f"{unsigned} event{'s' if unsigned != 1 else ''} in {chains} chain{'s' if chains != 1 else ''} "
                "not yet signed (after their chain's last signed head; the next signing pass signs them)."
            )

    def _verify_archive(self, url: str) -> None:
        key = signing_key()
        if key is None:
            raise CommandError(
                "--archive needs SAGA_AUDIT_KEY (or SAGA_AUDIT_KEY_FILE): archive manifests are signed "
                "with it, and a manifest cannot be checked without it.",
                returncode=2,
            )
        try:
            storage = storage_for(destination_parse(url), s3_endpoint_url=saga().archive_s3_endpoint_url)
            runs = failed = events = 0
            for report in archives_verify(storage, url, key=key):
                runs += 1
                events += report.events
                if report.problems:
                    failed += 1
                    name = f"run {report.run_id}" if report.run_id else report.where
                    for problem in report.problems:
                        self.stderr.write(f"{name} ({report.where}): {problem}.")
        except (DestinationError, StorageError) as exc:
            raise CommandError(f"--archive {url}: {exc}.", returncode=2) from None
        self.stdout.write(
            f"{runs} archived run{'s' if runs != 1 else ''} checked ({events} audit event{'s' if events != 1 else ''})."
        )
        if failed:
            raise CommandError(
                f"Archive {url}: {failed} of {runs} archived run{'s' if runs != 1 else ''} do not verify.",
                returncode=1,
            )
        if runs == 0:
            raise CommandError(f"Archive {url}: no archived run found there.", returncode=1)
        self.stdout.write(
            "Archive intact: every manifest's signature verifies, every records file matches its manifest "
            "and every run's audit chain recomputes to its signed head."
        )
