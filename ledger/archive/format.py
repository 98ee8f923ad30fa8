"""What an archived run looks like, pure (no database, no storage): its records as JSON lines, its
manifest and the manifest's signature, and the offline check of both.

A run's folder holds two files. ``records.jsonl.gz`` (or ``records.jsonl``): one JSON object a line,
``{"type": "run" | "action" | "checkpoint" | "event" | …, "row": {every column}}``, the run first,
the audit chain's events last, in chain order; an event line carries every hashed field and its
``id``, ``prev_hash`` and ``hash``, so the chain is recomputed from ``GENESIS`` with the audit log's
own hashing (``ledger.audit``; ``clients/spec/vectors/audit_events.json`` specifies it for a
verifier in any language). ``manifest.json``: the format and version, the tenant, the run, when it
was archived, the records file's name, SHA-256, size, line count and counts by type, the
chain (its name, length, head, first and last event id), the key's fingerprint and ``signature``:
HMAC-SHA256 under ``SAGA_AUDIT_KEY`` of the manifest's canonical JSON without its signature. The
records' SHA-256 is in the signed manifest, so editing any line (and re-compressing) or the
manifest is caught; the recomputed chain says which event line was edited.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import IO, Any
from uuid import UUID

from infra.hashing import canonical_json
from ledger.audit import GENESIS, _event_digest, _hashed_fields
from ledger.audit_signing import key_id, signature_matches
from ledger.models import Event

FORMAT = "saga-admin-run-archive"
VERSION = 1
MANIFEST = "manifest.json"
RECORDS_GZIP = "records.jsonl.gz"
RECORDS_PLAIN = "records.jsonl"
RUN, EVENT = "run", "event"
# The hashed fields an event line must carry, with its id and links.
EVENT_COLUMNS = frozenset(
    {
        "id",
        "tenant_id",
        "run_id",
        "chain",
        "kind",
        "subject_type",
        "subject_id",
        "from_state",
        "to_state",
        "actor_type",
        "actor_id",
        "actor_label",
        "reason",
        "data",
        "created_at",
        "prev_hash",
        "hash",
    }
)


def plain(value: Any) -> Any:
    """A column's value as JSON: datetimes in ISO 8601 with their microseconds and offset (what
    the audit hash covers), decimals and UUIDs as text, durations in seconds."""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def record_line(kind: str, row: dict[str, Any]) -> bytes:
    """One line of the records file."""
    return (canonical_json({"type": kind, "row": plain(row)}) + "\n").encode()


class RecordsWriter:
    """Writes the records file into ``out`` (gzip with no timestamp or name in its header, so the
    same rows make the same bytes), counting lines and types and following the chain."""

    def __init__(self, out: IO[bytes], *, compress: bool = True) -> None:
        self.out = out
        self.name = RECORDS_GZIP if compress else RECORDS_PLAIN
        self._stream: Any = (
            gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) if compress else out
        )
        self.lines = 0
        self.counts: Counter[str] = Counter()
        self.events = 0
        self.head = GENESIS
        self.first_event_id: int | None = None
        self.last_event_id: int | None = None

    def write(self, kind: str, row: dict[str, Any]) -> None:
        self._stream.write(record_line(kind, row))
        self.lines += 1
        self.counts[kind] += 1
        if kind == EVENT:
            self.events += 1
            self.head = str(row["hash"])
            self.first_event_id = self.first_event_id if self.first_event_id is not None else int(row["id"])
            self.last_event_id = int(row["id"])

    def close(self) -> tuple[str, int]:
        """Finish the file: (its SHA-256, its size in bytes), read back from ``out``."""
        if self._stream is not self.out:
            self._stream.close()
        self.out.flush()
        self.out.seek(0)
        digest, size = hashlib.sha256(), 0
        for chunk in iter(lambda: self.out.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
        self.out.seek(0)
        return digest.hexdigest(), size


def manifest_build(
    *,
    tenant: dict[str, Any],
    run: dict[str, Any],
    archived_at: datetime,
    records: RecordsWriter,
    records_sha256: str,
    records_bytes: int,
    key: bytes,
) -> dict[str, Any]:
    """The run's manifest, signed."""
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "tenant": tenant,
        "run": plain(run),
        "archived_at": archived_at.isoformat(),
        "records": {
            "file": records.name,
            "compression": "gzip" if records.name == RECORDS_GZIP else "none",
            "sha256": records_sha256,
            "bytes": records_bytes,
            "lines": records.lines,
            "counts": dict(sorted(records.counts.items())),
        },
        "chain": {
            "chain": f"run:{run['id']}",
            "events": records.events,
            "head": records.head,
            "first_event_id": records.first_event_id,
            "last_event_id": records.last_event_id,
        },
        "key_id": key_id(key),
    }
    manifest["signature"] = manifest_signature(manifest, key)
    return manifest


def manifest_signature(manifest: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 (hex) of the manifest's canonical JSON without its ``signature``."""
    unsigned = {k: v for k, v in manifest.items() if k != "signature"}
    return hmac.new(key, canonical_json(unsigned).encode(), hashlib.sha256).hexdigest()


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """The manifest file: its canonical JSON (what its SHA-256 in ``ArchivedRun`` covers)."""
    return (canonical_json(manifest) + "\n").encode()


# --- Verifying ------------------------------------------------------------------------------------


@dataclass
class ArchiveReport:
    """What checking one run's archive found: ``problems`` (empty: it verifies), each naming the
    line of the records file it is about when there is one."""

    where: str
    run_id: str = ""
    events: int = 0
    lines: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, problem: str, *, line: int | None = None) -> None:
        self.problems.append(f"line {line}: {problem}" if line is not None else problem)


def manifest_read(data: bytes, report: ArchiveReport, *, key: bytes) -> dict[str, Any] | None:
    """The manifest, if it is one of ours and its signature verifies under ``key``."""
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        report.add(f"manifest: not JSON ({exc})")
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        report.add(f"manifest: not a {FORMAT} manifest")
        return None
    if manifest.get("version") != VERSION:
        report.add(
            f"manifest: version {manifest.get('version')!r} is not one this verifier reads ({VERSION})"
        )
        return None
    run = manifest.get("run")
    report.run_id = str(run.get("id", "")) if isinstance(run, dict) else ""
    expected = manifest_signature(manifest, key)
    if not signature_matches(expected, str(manifest.get("signature", ""))):
        if manifest.get("key_id") != key_id(key):
            report.add(
                f"manifest: signed with another key (key id {str(manifest.get('key_id'))[:16]}, "
                f"SAGA_AUDIT_KEY's is {key_id(key)}): its signature does not verify"
            )
        else:
            report.add("manifest: its signature does not verify (the manifest was altered or forged)")
        return None
    return manifest


def _event_of(row: dict[str, Any]) -> Event:
    return Event(
        id=row["id"],
        tenant_id=row["tenant_id"],
        run_id=row["run_id"],
        chain=row["chain"],
        kind=row["kind"],
        subject_type=row["subject_type"],
        subject_id=row["subject_id"],
        from_state=row["from_state"],
        to_state=row["to_state"],
        actor_type=row["actor_type"],
        actor_id=row["actor_id"],
        actor_label=row["actor_label"],
        reason=row["reason"],
        data=row["data"],
        created_at=datetime.fromisoformat(row["created_at"]),
        prev_hash=row["prev_hash"],
        hash=row["hash"],
    )


def _lines(data: bytes, compressed: bool, report: ArchiveReport) -> Iterable[bytes]:
    if not compressed:
        return data.splitlines()
    try:
        return gzip.decompress(data).splitlines()
    except (OSError, EOFError, zlib.error) as exc:
        report.add(f"records: not a readable gzip file ({exc})")
        return []


class _ChainCheck:
    """The run's chain recomputed from ``GENESIS``, line by line."""

    def __init__(self, chain: str, report: ArchiveReport) -> None:
        self.chain, self.report = chain, report
        self.prev = GENESIS
        self.count = 0
        self.first_id: int | None = None
        self.last_id: int | None = None
        self.broken = False

    def event(self, row: Any, line: int) -> None:
        if self.broken:
            return
        if not isinstance(row, dict) or not set(row) >= EVENT_COLUMNS:
            self.report.add("event: a column is missing", line=line)
            self.broken = True
            return
        try:
            event = _event_of(row)
            digest = _event_digest(self.prev, _hashed_fields(event))
        except (TypeError, ValueError) as exc:
            self.report.add(f"event {row.get('id')}: unreadable ({exc})", line=line)
            self.broken = True
            return
        if row["chain"] != self.chain:
            self.report.add(
                f"event {row['id']}: belongs to chain {row['chain']}, not {self.chain}", line=line
            )
        elif row["prev_hash"] != self.prev:
            self.report.add(
                f"event {row['id']}: prev_hash does not match the previous event's hash", line=line
            )
        elif row["hash"] != digest:
            self.report.add(f"event {row['id']}: its content does not match its hash", line=line)
        else:
            self.prev = digest
            self.count += 1
            self.first_id = self.first_id if self.first_id is not None else int(row["id"])
            self.last_id = int(row["id"])
            return
        self.broken = True


def records_verify(manifest: dict[str, Any], data: bytes, report: ArchiveReport) -> None:
    """The records file against its signed manifest: SHA-256, line count, counts by type, every
    line a record of this run, and the chain recomputed to the manifest's head."""
    records, chain = manifest.get("records") or {}, manifest.get("chain") or {}
    run_id = report.run_id
    if hashlib.sha256(data).hexdigest() != records.get("sha256"):
        report.add(
            f"records: {records.get('file')}'s SHA-256 does not match the manifest (the file was altered)"
        )
    check = _ChainCheck(f"run:{run_id}", report)
    counts: Counter[str] = Counter()
    lines = 0
    for lines, raw in enumerate(_lines(data, records.get("compression") == "gzip", report), start=1):
        try:
            record = json.loads(raw)
            kind, row = record["type"], record["row"]
        except (ValueError, TypeError, KeyError, UnicodeDecodeError):
            report.add("not a record ({type, row})", line=lines)
            continue
        counts[str(kind)] += 1
        if lines == 1 and (kind != RUN or not isinstance(row, dict) or row.get("id") != run_id):
            report.add(f"the first record is not run {run_id}", line=lines)
        elif kind == EVENT:
            check.event(row, lines)
        elif isinstance(row, dict) and "run_id" in row and row["run_id"] != run_id:
            report.add(f"a {kind} of run {row['run_id']}, not of {run_id}", line=lines)
    report.lines, report.events = lines, check.count
    if lines != records.get("lines"):
        report.add(f"records: {lines} lines, the manifest says {records.get('lines')}")
    if dict(counts) != records.get("counts"):
        report.add(
            f"records: counts by type {dict(sorted(counts.items()))}, the manifest says {records.get('counts')}"
        )
    if not check.broken and (
        check.count != chain.get("events")
        or check.prev != chain.get("head")
        or check.first_id != chain.get("first_event_id")
        or check.last_id != chain.get("last_event_id")
    ):
        report.add(
            f"chain: {check.count} events ending at {check.prev[:16]}…, the manifest says "
            f"{chain.get('events')} ending at {str(chain.get('head'))[:16]}…"
        )


def archive_verify(manifest_data: bytes, records_of: Any, *, key: bytes, where: str) -> ArchiveReport:
    """One run's archive: its manifest (``manifest_data``) and the records file ``records_of(name)``
    returns (bytes; ``FileNotFoundError`` when missing, another ``OSError`` when unreadable)."""
    report = ArchiveReport(where=where)
    manifest = manifest_read(manifest_data, report, key=key)
    if manifest is None:
        return report
    name = str((manifest.get("records") or {}).get("file", ""))
    if name not in (RECORDS_GZIP, RECORDS_PLAIN):
        report.add(f"manifest: records file {name!r} is not one this format names")
        return report
    try:
        data = records_of(name)
    except FileNotFoundError:
        report.add(f"records: {name} is missing")
        return report
    except OSError as exc:
        report.add(f"records: {name} cannot be read ({exc})")
        return report
    records_verify(manifest, data, report)
    return report
