"""``verify_audit --archive URL``: every run archived under ``URL`` checked offline, from its files
alone (``ledger.archive.format``), with ``SAGA_AUDIT_KEY``; nothing is read from the database."""

from __future__ import annotations

from collections.abc import Iterator

from ledger.archive.destinations import Destination, destination_parse
from ledger.archive.format import MANIFEST, ArchiveReport, archive_verify
from ledger.archive.storage import Storage, StorageError


def _folder_problem(manifest_at: Destination, report: ArchiveReport) -> None:
    """A manifest sits at ``…/<tenant slug>/runs/<run id>/manifest.json``: the run it names is the
    run of its folder (a manifest copied into another run's folder does not pass for it)."""
    segments = manifest_at.segments
    if len(segments) < 4 or segments[-3] != "runs" or segments[-2] != report.run_id:
        report.add(f"manifest: names run {report.run_id or '?'}, but sits in {manifest_at.url}")


def archives_verify(storage: Storage, url: str, *, key: bytes) -> Iterator[ArchiveReport]:
    """One report per manifest found under ``url`` (``StorageError`` or ``DestinationError`` when
    ``url`` cannot be read at all)."""
    under = destination_parse(url)
    for manifest_at in storage.find(under, MANIFEST):
        folder = Destination(manifest_at.scheme, manifest_at.bucket, manifest_at.segments[:-1])
        try:
            manifest_data = storage.get(manifest_at)
        except (FileNotFoundError, StorageError) as exc:
            report = ArchiveReport(where=manifest_at.url)
            report.add(f"manifest: cannot be read ({exc})")
            yield report
            continue
        report = archive_verify(
            manifest_data,
            lambda name, folder=folder: storage.get(folder.child(name)),
            key=key,
            where=folder.url,
        )
        if report.run_id:
            _folder_problem(manifest_at, report)
        yield report
