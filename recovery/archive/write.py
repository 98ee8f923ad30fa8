"""A run's archive written and confirmed: its records file and its signed manifest, each read back
and compared before anything is removed (``ledger.archive.storage.put_confirmed``). Writing again
(a re-run after a crash) overwrites both whole; the manifest goes last, so a manifest is only ever
next to the records it describes."""

from __future__ import annotations

import io
import tempfile
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from ledger.archive.destinations import Destination, run_folder
from ledger.archive.format import MANIFEST, RUN, RecordsWriter, manifest_build, manifest_bytes
from ledger.archive.storage import Storage, put_confirmed
from ledger.models import Tenant
from recovery.archive.records import ARCHIVED

# A run's records are kept in memory up to this size, then in a temporary file.
_SPOOL_BYTES = 16 << 20


class RunChanged(Exception):
    """The run moved while its records were read (its chain's head is not the one its row had)."""


@dataclass(frozen=True)
class Written:
    """A run's archive as written: what its removal checks the live run against and records."""

    run_id: str
    tenant_id: int
    agent: str
    owner: str
    status: str
    created_at: datetime
    finished_at: datetime
    archived_at: datetime
    head: str
    events: int
    manifest_url: str
    manifest_sha256: str


def rows_of_runs(run_ids: list[str]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every archived model's rows of each of ``run_ids``: run id -> kind -> rows, read with one
    statement a model for the whole batch. The run's row is read first, so an event appended while
    the rest is read moves the chain's head past the run row's (``RunChanged``)."""
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {run_id: {} for run_id in run_ids}
    for archived in ARCHIVED:
        for run_id, found in archived.rows_of_runs(run_ids).items():
            rows[run_id][archived.kind] = found
    return rows


def archive_write(
    run_id: str,
    *,
    tenant: Tenant,
    destination: Destination,
    storage: Storage,
    key: bytes,
    compress: bool,
    rows: dict[str, list[dict[str, Any]]] | None = None,
) -> Written:
    """Write run ``run_id``'s records and manifest under ``destination``'s folder for it, and
    confirm both. ``rows``: the run's rows by kind, read already with its batch (``rows_of_runs``);
    without it, read here. ``RunChanged`` when the run moved while it was read; ``StorageError``
    when a file could not be written or confirmed; ``LookupError`` when the run is gone."""
    folder = run_folder(destination, tenant_slug=tenant.slug, run_id=run_id)
    archived_at = timezone.now()
    run: dict[str, Any] | None = None
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as out:
        records = RecordsWriter(out, compress=compress)
        for archived in ARCHIVED:
            for row in archived.rows(run_id) if rows is None else rows.get(archived.kind, []):
                if archived.kind == RUN:
                    run = row
                records.write(archived.kind, row)
        if run is None:
            raise LookupError(f"run {run_id} is gone")
        # Read first, so any event appended while the rest was read moved the head past it.
        if (run["audit_head"] or "") != (records.head if records.events else ""):
            raise RunChanged(run_id)
        sha256, size = records.close()
        manifest = manifest_build(
            tenant={"id": tenant.pk, "slug": tenant.slug},
            run={key_: run[key_] for key_ in ("id", "agent", "owner", "status", "created_at", "finished_at")},
            archived_at=archived_at,
            records=records,
            records_sha256=sha256,
            records_bytes=size,
            key=key,
        )
        put_confirmed(storage, folder.child(records.name), out)
    manifest_at = folder.child(MANIFEST)
    manifest_sha256 = put_confirmed(storage, manifest_at, io.BytesIO(manifest_bytes(manifest)))
    return Written(
        run_id=run_id,
        tenant_id=tenant.pk,
        agent=str(run["agent"]),
        owner=str(run["owner"]),
        status=str(run["status"]),
        created_at=run["created_at"],
        finished_at=run["finished_at"],
        archived_at=archived_at,
        head=manifest["chain"]["head"],
        events=int(manifest["chain"]["events"]),
        manifest_url=manifest_at.url,
        manifest_sha256=manifest_sha256,
    )
