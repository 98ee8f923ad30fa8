"""The "At size" phase's retention, when the archiver (``recovery.archive.runs_archive``) is there:
one batch of ``archive_batch`` runs while 16 clients append, then the rest of retention, ``VACUUM
FULL`` of the growing tables, their sizes again, and the audit log verified on what is live and
what is archived."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from bench import fixtures
from bench.loadgen import LoadControl
from bench.size_world import CLIENTS, GROWING, LOAD_TENANT, RETENTION, table_sizes
from bench.stats import log, summarize

if TYPE_CHECKING:
    from bench.harness import Harness


def _archiver() -> Any:
    """The archiver's entry point (``recovery.archive.runner``), None when it is not in the tree."""
    try:
        from recovery.archive import runner
    except ImportError:
        return None
    return runner if hasattr(runner, "runs_archive") else None


def _configure_retention(h: Harness, archive_url: str) -> None:
    """``audit.retention`` in the global policy document (the bench's policies beside it)."""
    from django.core.management import call_command

    document = {
        **fixtures.BENCH_POLICIES,
        "audit": {"retention": {"closed_runs": RETENTION, "archive": archive_url}},
    }
    path = h.log_dir / "size-retention-policies.json"
    path.write_text(json.dumps(document, indent=2))
    call_command("load_policies", str(path), verbosity=0, stdout=io.StringIO())


def _outcome(result: Any) -> Any:
    """An ``ArchiveResult`` in a few numbers (its lists name every run)."""
    if not hasattr(result, "archived"):
        return _jsonable(result)
    skipped: dict[str, int] = {}
    for outcome in result.skipped:
        skipped[outcome.detail[:80]] = skipped.get(outcome.detail[:80], 0) + 1
    return {"archived": len(result.archived), "skipped": skipped, "errors": list(result.errors)[:10]}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, default=str)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _archived(result: Any) -> int:
    """How many runs an ``runs_archive`` call moved, whatever shape it answers in (a count, a
    list, a mapping or an object with a count)."""
    if isinstance(result, bool) or result is None:
        return 0
    if isinstance(result, int):
        return result
    if isinstance(result, list | tuple):
        return len(result)
    counts = result if isinstance(result, dict) else getattr(result, "__dict__", {})
    for key in ("archived", "runs", "archived_runs", "count"):
        value = counts.get(key)
        if isinstance(value, int):
            return value
        if isinstance(value, list | tuple):
            return len(value)
    return 0


def _batch_under_append(
    h: Harness, archive: Any, append_params: dict[str, Any], web: Any
) -> tuple[Any, float, Any]:
    """One ``runs_archive`` batch, started once 16 clients' append window has begun; the window
    ends when the batch does. (its result, its seconds, the append's LoadResult)"""
    control = LoadControl()
    loaded: dict[str, Any] = {}
    failure: list[BaseException] = []

    def append_load() -> None:
        try:
            loaded["result"] = h.load(
                "record_action", CLIENTS, append_params, web=web, window_s=7200, control=control
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            failure.append(exc)

    thread = threading.Thread(target=append_load, name="size-append-load", daemon=True)
    thread.start()
    try:
        if not control.wait_window(timeout=300):
            raise RuntimeError("the append load's window did not begin within 300 s")
        t = time.perf_counter()
        result = archive.runs_archive(limit=h.sizes.archive_batch)
        seconds = time.perf_counter() - t
    finally:
        control.stop()
        thread.join(timeout=600)
    if failure:
        raise failure[0]
    return result, seconds, loaded["result"]


def _load_share(sizes: dict[str, Any]) -> dict[str, Any]:
    """The bytes of ``sizes`` that are the append load's own rows (its tenant, ``bench-size``: runs
    it made and wrote to while the batch ran, none of them part of the seeded year): per growing
    table with a tenant, its rows of that tenant times the table's bytes per row."""
    from django.db import connection

    share: dict[str, Any] = {"tables": {}, "bytes": 0}
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM ledger_tenant WHERE slug = %s", [LOAD_TENANT])
        row = cursor.fetchone()
        if row is None:
            return share
        for table in GROWING:
            size = sizes.get(table)
            if not size:
                continue
            cursor.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'tenant_id'",
                [table],
            )
            if cursor.fetchone() is None:
                continue
            cursor.execute(f"SELECT count(*), count(*) FILTER (WHERE tenant_id = %s) FROM {table}", [row[0]])  # noqa: S608
            total, load = cursor.fetchone()
            if total and load:
                part = int(size["total"] * load / total)
                share["tables"][table] = {"rows": load, "of": total, "bytes": part}
                share["bytes"] += part
    return share


def _vacuum_full() -> float:
    from django.db import connection

    t = time.perf_counter()
    with connection.cursor() as cursor:
        for table in GROWING:
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is not None:
                cursor.execute(f"VACUUM (FULL, ANALYZE) {table}")
    return time.perf_counter() - t


def _verify_archived(archive_url: str, key: str) -> dict[str, Any]:
    """Every archive under ``archive_url`` checked offline, as ``verify_audit --archive`` does
    (``ledger.archive.verify``): the runs checked, and the problems found (none: ok)."""
    from ledger.archive.destinations import destination_parse
    from ledger.archive.storage import storage_for
    from ledger.archive.verify import archives_verify

    t = time.perf_counter()
    runs, events = 0, 0
    problems: list[str] = []
    storage = storage_for(destination_parse(archive_url))
    for report in archives_verify(storage, archive_url, key=key.encode()):
        runs += 1
        events += report.events
        problems.extend(f"{report.where}: {problem}" for problem in report.problems[:3])
    return {
        "ok": runs > 0 and not problems,
        "runs": runs,
        "events": events,
        "problems": problems[:20],
        "seconds": time.perf_counter() - t,
    }


def retention(
    h: Harness,
    keys: list[tuple[str, str]],
    web: Any,
) -> dict[str, Any]:
    """One archive batch under the append, then the rest of retention, VACUUM FULL, verify."""
    archive = _archiver()
    if archive is None:
        return {
            "available": False,
            "note": "archiver not available (recovery.archive.runs_archive is not in this tree)",
        }
    if h.sizes.archive_batch <= 0:
        return {"available": False, "note": "not run in this measurement (--size-archive-batch 0)"}
    from bench import size_seed

    # Runs for ~300 appends/s over the batch's expected length (a client that runs out goes on
    # recording into its last run): made only when there is a batch to append beside.
    per_run = 10
    append_params = {
        "runs": fixtures.fresh_runs(
            keys=keys, per_client=int(300 * h.sizes.archive_expected_s / per_run / CLIENTS) + 2
        ),
        "per_run": per_run,
        "headers_per_client": {i: {"Authorization": f"Bearer {keys[i][1]}"} for i in range(CLIENTS)},
    }

    out: dict[str, Any] = {"available": True, "retention": RETENTION}
    archive_dir = (h.log_dir / "size-archive").resolve()
    archive_dir.mkdir(parents=True, exist_ok=True)
    archive_url = f"file://{archive_dir}"
    # The operator's side of the archive: a key for its signatures and the one destination allowed
    # (in the environment, and in the settings, which read theirs when this process started).
    from django.conf import settings

    key = os.environ.setdefault("SAGA_AUDIT_KEY", "bench-size-audit-key-not-for-production-0123456789abcdef")
    if not getattr(settings, "AUDIT_KEY", ""):
        settings.AUDIT_KEY = key
    os.environ["SAGA_ARCHIVE_ALLOWED_URLS"] = archive_url
    settings.SAGA = {**settings.SAGA, "ARCHIVE_ALLOWED_URLS": [archive_url]}
    _configure_retention(h, archive_url)
    t = time.perf_counter()
    out["dry_run"] = _outcome(archive.runs_archive(dry_run=True))
    out["dry_run_s"] = time.perf_counter() - t
    log(f"size: one archive batch of {h.sizes.archive_batch} runs while {CLIENTS} clients append")
    result, out["batch_s"], during = _batch_under_append(h, archive, append_params, web)
    out["batch_result"], out["batch_runs"] = _outcome(result), _archived(result)
    out["append_during_batch"] = summarize(during, "record_action")
    log(f"size: archive batch took {out['batch_s']:.0f}s; the rest of retention")
    t = time.perf_counter()
    rounds = []
    while time.perf_counter() - t < h.sizes.retention_timeout_s:
        moved = _archived(archive.runs_archive(limit=h.sizes.archive_batch))
        rounds.append(moved)
        if not moved:
            break
    out["rest_rounds"], out["rest_runs"] = len(rounds), sum(rounds)
    out["rest_s"] = time.perf_counter() - t
    out["rest_timed_out"] = bool(rounds and rounds[-1])
    out["sizes_after"] = table_sizes()
    log("size: VACUUM FULL of the growing tables")
    out["vacuum_full_s"] = _vacuum_full()
    out["sizes_after_vacuum"] = table_sizes()
    out["load_share"] = _load_share(out["sizes_after_vacuum"])
    out["verify_live"] = size_seed.check(sample=h.sizes.verify_sample)
    out["verify_archived"] = _verify_archived(archive_url, settings.AUDIT_KEY or key)
    return out
