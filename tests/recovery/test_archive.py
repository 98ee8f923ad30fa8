"""Retention's write side (``recovery.archive``): closed runs past their tenant's window are
written with everything that references them and their whole audit chain to a file URL (here) or
S3 (tests/recovery/test_archive_s3.py), checked offline by ``verify_audit --archive``, and removed
from PostgreSQL by the one path the audit protections allow, which records it."""

from __future__ import annotations

import gzip
import json
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, models, transaction

from ledger.archive.storage import FileStorage
from ledger.audit import Actor, audit_record
from ledger.models import Action, ArchivedRun, Event, Run, SignedHead
from recovery import jobs, scheduling
from recovery.archive import runner
from recovery.archive.policy import tenant_retentions
from recovery.archive.records import ARCHIVED
from recovery.archive.remove import archive_commit
from recovery.archive.write import archive_write
from tests.factories import make_run
from tests.recovery.archive_support import KEY, age, allow, closed_run, folder_url, retention, verify_archive

pytestmark = pytest.mark.django_db


@pytest.fixture
def archive(settings, tmp_path) -> Path:
    """An allowed archive folder, the key set, and Acme's retention: closed runs kept a day."""
    settings.AUDIT_KEY = KEY
    base = tmp_path / "archive"
    base.mkdir()
    allow(settings, folder_url(base))
    return base


@pytest.fixture
def acme_retention(archive, tenant):
    retention(tenant, folder_url(archive))
    return archive


def _rows_of(run_id: str) -> dict[str, int]:
    return {a.kind: sum(1 for _ in a.rows(run_id)) for a in ARCHIVED}


def test_a_closed_run_past_its_window_is_archived_whole_and_removed(acme_retention, tenant, agent):
    run = age(closed_run(tenant, agent))
    before = _rows_of(run.pk)
    head, events = run.audit_head, before["event"]
    assert before["action"] >= 4 and before["checkpoint"] == 1 and before["approval"] == 1
    assert before["recovery_item"] == 1 and events > 5

    result = runner.runs_archive()

    manifest_url = f"file://{acme_retention}/acme/runs/{run.pk}/manifest.json"
    assert [(o.run_id, o.detail) for o in result.archived] == [(run.pk, manifest_url)]
    assert result.skipped == [] and result.errors == []
    # Gone from PostgreSQL, every row of every kind.
    assert all(count == 0 for count in _rows_of(run.pk).values())
    # (a) the tombstone
    tomb = ArchivedRun.objects.get(run_id=run.pk)
    assert (tomb.tenant_id, tomb.head, tomb.events, tomb.archive) == (tenant.pk, head, events, manifest_url)
    assert (tomb.status, tomb.agent, tomb.finished_at) == (run.status, run.agent, run.finished_at)
    manifest_file = acme_retention / "acme" / "runs" / run.pk / "manifest.json"
    import hashlib

    assert tomb.manifest_sha256 == hashlib.sha256(manifest_file.read_bytes()).hexdigest()
    # (b) the tenant-chain event naming the run and its head
    recorded = Event.objects.get(chain=f"tenant:{tenant.pk}", kind="run.archived")
    assert recorded.run_id is None and (recorded.subject_type, recorded.subject_id) == ("run", run.pk)
    assert recorded.data == {
        "run": run.pk,
        "head": head,
        "events": events,
        "archive": manifest_url,
        "manifest_sha256": tomb.manifest_sha256,
    }
    # (c) the chain's head signed at its archived length
    signed = SignedHead.objects.get(chain=f"run:{run.pk}", position=events)
    assert signed.head == head and signed.reason == SignedHead.Reason.ARCHIVE
    # The files: JSON lines, the run first, the chain last; the manifest counts them.
    manifest = json.loads(manifest_file.read_text())
    lines = [
        json.loads(line)
        for line in gzip.decompress((manifest_file.parent / "records.jsonl.gz").read_bytes()).splitlines()
    ]
    assert lines[0]["type"] == "run" and lines[0]["row"]["id"] == run.pk
    assert [line["type"] for line in lines[-events:]] == ["event"] * events
    assert manifest["records"]["counts"] == {k: v for k, v in before.items() if v}
    assert manifest["chain"] == {
        "chain": f"run:{run.pk}",
        "events": events,
        "head": head,
        "first_event_id": lines[-events]["row"]["id"],
        "last_event_id": lines[-1]["row"]["id"],
    }
    assert manifest["tenant"] == {"id": tenant.pk, "slug": "acme"}
    out, _ = verify_archive(folder_url(acme_retention))
    assert f"1 archived run checked ({events} audit events)." in out and "Archive intact" in out


def test_every_model_that_reaches_a_run_is_archived():
    """A model with a foreign key path to a run (or an action, which belongs to one), or a run_id
    column that is not a key, must be in ARCHIVED: else it would block the removal of archived
    runs (a key) or escape their archives."""
    reaching: set[type[models.Model]] = {Run}
    changed = True
    while changed:
        changed = False
        for model in apps.get_models():
            if model in reaching:
                continue
            keys = [f for f in model._meta.concrete_fields if f.is_relation and f.related_model is not None]
            run_column = any(f.attname == "run_id" and not f.is_relation for f in model._meta.concrete_fields)
            if run_column or any(f.related_model in reaching for f in keys):
                reaching.add(model)
                changed = True
    assert Action in reaching and Event in reaching
    # The tombstone names an archived run (run_id, no key): it is what the removal leaves behind.
    assert {a.model for a in ARCHIVED} == reaching - {ArchivedRun}


def test_a_dry_run_lists_what_would_go_and_what_stays_and_changes_nothing(acme_retention, tenant, agent):
    old = age(closed_run(tenant, agent))
    recent = closed_run(tenant, agent, email="recent@company.com")  # closed a moment ago: kept
    failed = age(closed_run(tenant, agent, email="failed@company.com"))
    Run.objects.filter(pk=failed.pk).update(status=Run.Status.FAILED)  # not closed: kept
    events, runs = Event.objects.count(), Run.objects.count()

    out = StringIO()
    call_command("archive_runs", dry_run=True, stdout=out)

    text = out.getvalue()
    assert f"would archive {old.pk} (tenant acme)" in text
    assert recent.pk not in text and failed.pk not in text
    assert "1 run would archive, 0 left (dry run: nothing was changed)." in text
    assert (Event.objects.count(), Run.objects.count()) == (events, runs)
    assert not ArchivedRun.objects.exists() and not any(acme_retention.iterdir())


def test_a_run_with_anything_open_is_left_and_said_why(acme_retention, tenant, agent):
    run = age(closed_run(tenant, agent))
    pending = make_run(tenant, agent)
    from tests.factories import gated_run

    gated, _action, _approval = gated_run(tenant, agent)
    from ledger.services import runs

    runs.run_cancel(run=gated, actor=agent, reason="stop")
    age(gated)
    out = StringIO()
    call_command("archive_runs", dry_run=True, stdout=out)
    assert f"left {gated.pk} (tenant acme): an approval is pending" in out.getvalue()
    result = runner.runs_archive()
    assert [o.run_id for o in result.archived] == [run.pk]
    assert Run.objects.filter(pk__in=[gated.pk, pending.pk]).count() == 2


def test_editing_any_archived_line_or_the_manifest_makes_verify_fail(acme_retention, tenant, agent):
    run = age(closed_run(tenant, agent))
    runner.runs_archive()
    folder = acme_retention / "acme" / "runs" / run.pk
    records, manifest = folder / "records.jsonl.gz", folder / "manifest.json"
    original_records, original_manifest = records.read_bytes(), manifest.read_bytes()
    lines = gzip.decompress(original_records).splitlines()

    def fails(what: str) -> str:
        err = StringIO()
        with pytest.raises(CommandError) as excinfo:
            call_command("verify_audit", archive=folder_url(acme_retention), stdout=StringIO(), stderr=err)
        assert excinfo.value.returncode == 1, what
        return err.getvalue()

    # An event line edited, and the file re-gzipped: the chain says which line.
    event_at = next(n for n, line in enumerate(lines) if json.loads(line)["type"] == "event") + 2
    edited = json.loads(lines[event_at - 1])
    edited["row"]["reason"] = "nothing happened here"
    changed = [*lines[: event_at - 1], json.dumps(edited).encode(), *lines[event_at:]]
    records.write_bytes(gzip.compress(b"\n".join(changed) + b"\n"))
    err = fails("event line")
    assert f"run {run.pk}" in err and f"line {event_at}: event" in err and "does not match its hash" in err
    assert "SHA-256 does not match the manifest" in err

    # An action's args edited: the records' SHA-256 (signed in the manifest) catches it.
    action_at = next(n for n, line in enumerate(lines) if json.loads(line)["type"] == "action")
    edited = json.loads(lines[action_at])
    edited["row"]["args"] = {"amount": 4000}
    records.write_bytes(
        gzip.compress(
            b"\n".join([*lines[:action_at], json.dumps(edited).encode(), *lines[action_at + 1 :]]) + b"\n"
        )
    )
    assert "SHA-256 does not match the manifest" in fails("action line")

    # A line removed.
    records.write_bytes(gzip.compress(b"\n".join(lines[:-1]) + b"\n"))
    assert "lines, the manifest says" in fails("line removed")
    records.write_bytes(original_records)

    # The manifest edited (its SHA-256 updated to match edited records, say): the signature fails.
    forged = json.loads(original_manifest)
    forged["records"]["lines"] += 1
    manifest.write_text(json.dumps(forged))
    assert "its signature does not verify" in fails("manifest")
    manifest.write_bytes(original_manifest)

    # The records file missing.
    records.unlink()
    assert "records: records.jsonl.gz is missing" in fails("missing")
    records.write_bytes(original_records)
    out, _ = verify_archive(folder_url(acme_retention))
    assert "Archive intact" in out


def test_a_manifest_copied_into_another_runs_folder_does_not_pass_for_it(acme_retention, tenant, agent):
    run = age(closed_run(tenant, agent))
    runner.runs_archive()
    source = acme_retention / "acme" / "runs" / run.pk
    target = acme_retention / "acme" / "runs" / "run_someoneelse"
    target.mkdir()
    for name in ("manifest.json", "records.jsonl.gz"):
        (target / name).write_bytes((source / name).read_bytes())
    with pytest.raises(CommandError):
        call_command(
            "verify_audit", archive=folder_url(acme_retention), stdout=StringIO(), stderr=(err := StringIO())
        )
    assert f"names run {run.pk}, but sits in" in err.getvalue()


def test_another_key_does_not_verify_and_no_key_is_a_clear_error(acme_retention, tenant, agent, settings):
    age(closed_run(tenant, agent))
    runner.runs_archive()
    settings.AUDIT_KEY = "another key entirely"
    with pytest.raises(CommandError):
        call_command(
            "verify_audit", archive=folder_url(acme_retention), stdout=StringIO(), stderr=(err := StringIO())
        )
    assert "signed with another key" in err.getvalue()
    settings.AUDIT_KEY = ""
    with pytest.raises(CommandError, match="--archive needs SAGA_AUDIT_KEY") as excinfo:
        call_command("verify_audit", archive=folder_url(acme_retention))
    assert excinfo.value.returncode == 2


def test_without_the_key_nothing_is_archived_and_the_command_says_why(
    acme_retention, tenant, agent, settings
):
    run = age(closed_run(tenant, agent))
    settings.AUDIT_KEY = ""
    with pytest.raises(CommandError, match="SAGA_AUDIT_KEY"):
        call_command("archive_runs", stdout=StringIO())
    assert jobs.runs_archive() == {"archived": 0, "skipped": 0, "errors": 1}
    assert Run.objects.filter(pk=run.pk).exists()


def _write_only(run, tenant, *, compress):
    """A run's files written under its tenant's retention, as a pass does before its commit."""
    (retention_,) = [r for _, r in tenant_retentions(tenant=tenant)]
    return archive_write(
        run.pk,
        tenant=tenant,
        destination=retention_.archive,
        storage=FileStorage(),
        key=KEY.encode(),
        compress=compress,
    )


def test_files_written_but_not_committed_are_written_again_by_the_next_pass(acme_retention, tenant, agent):
    """A crash between the write and the commit: the run is live, its files there; the next pass
    writes them again, whole, and removes the run."""
    run = age(closed_run(tenant, agent))
    first = _write_only(run, tenant, compress=True)
    assert Run.objects.filter(pk=run.pk).exists()
    result = runner.runs_archive()
    assert [o.run_id for o in result.archived] == [run.pk]
    assert ArchivedRun.objects.get(run_id=run.pk).head == first.head
    assert "Archive intact" in verify_archive(folder_url(acme_retention))[0]


def test_a_run_that_moved_after_its_archive_was_written_stays_live(acme_retention, tenant, agent):
    run = age(closed_run(tenant, agent))
    written = _write_only(run, tenant, compress=False)
    audit_record(
        tenant=tenant, actor=Actor.system("tests"), kind="run.noted", subject=run, run=run, reason="late note"
    )
    assert "it changed after its archive was written" in archive_commit(written, key=KEY.encode())
    assert Run.objects.filter(pk=run.pk).exists() and not ArchivedRun.objects.exists()
    # The next pass archives it as it is now.
    assert [o.run_id for o in runner.runs_archive().archived] == [run.pk]
    assert ArchivedRun.objects.get(run_id=run.pk).events == written.events + 1


def test_the_worker_archives_periodically(acme_retention, tenant, agent):
    assert "recovery.jobs.runs_archive" in {p.func for p in scheduling.periodic_jobs()}
    run = age(closed_run(tenant, agent))
    assert jobs.runs_archive() == {"archived": 1, "skipped": 0, "errors": 0}
    assert ArchivedRun.objects.filter(run_id=run.pk).exists()


def test_a_destination_the_operator_no_longer_allows_archives_nothing(
    acme_retention, tenant, agent, settings
):
    run = age(closed_run(tenant, agent))
    allow(settings, "file:///somewhere/else")
    result = runner.runs_archive()
    assert (
        result.archived == [] and "is not at or under a destination the operator allows" in result.errors[0]
    )
    assert Run.objects.filter(pk=run.pk).exists()
    with pytest.raises(CommandError, match="could not be archived"):
        call_command("archive_runs", stdout=StringIO(), stderr=StringIO())


def test_tenants_are_archived_each_under_its_own_folder_and_the_tenants_own_retention_wins(
    archive, tenant, other_tenant, agent, outsider_key
):
    retention(None, folder_url(archive), "30d")  # global: a month
    retention(tenant, folder_url(archive), "1d", agent_safety=True)  # Acme: a day
    acme = age(closed_run(tenant, agent))
    globex_agent = Actor.for_key(outsider_key[0])
    globex_young = age(closed_run(other_tenant, globex_agent, email="g1@globex.com"))
    globex_old = age(closed_run(other_tenant, globex_agent, email="g2@globex.com"), days=31)
    result = runner.runs_archive()
    assert sorted((o.tenant, o.run_id) for o in result.archived) == sorted(
        [("acme", acme.pk), ("globex", globex_old.pk)]
    )
    assert Run.objects.filter(pk=globex_young.pk).exists()
    assert (archive / "globex" / "runs" / globex_old.pk / "manifest.json").exists()
    assert (archive / "acme" / "runs" / acme.pk / "manifest.json").exists()
    # --tenant and --limit
    assert runner.runs_archive(tenant=tenant).archived == []


ROLE = "saga_app_archiver"


def _as_app_role() -> None:
    """The application's least-privileged role (``db_grants``), inside the test's transaction."""
    out = StringIO()
    call_command("db_grants", role=ROLE, stdout=out)
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {ROLE} NOLOGIN")
        for statement in out.getvalue().splitlines():
            cursor.execute(statement)
        cursor.execute(f"SET ROLE {ROLE}")


def _refused(sql: str, params: list[str] | None = None) -> str:
    with pytest.raises(DatabaseError) as excinfo, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    return str(excinfo.value)


def test_the_least_privileged_role_archives_through_the_function_and_deletes_nothing_else(
    acme_retention, tenant, agent
):
    run = age(closed_run(tenant, agent))
    other = age(closed_run(tenant, agent, email="other@company.com"))
    Run.objects.filter(pk=other.pk).update(status=Run.Status.FAILED)  # not archived
    _as_app_role()
    try:
        assert [o.run_id for o in runner.runs_archive().archived] == [run.pk]
        assert not Event.objects.filter(chain=f"run:{run.pk}").exists()
        # The role still cannot delete events itself, pgtrigger's bypass or not.
        assert "permission denied" in _refused(
            "DELETE FROM ledger_event WHERE chain = %s", [f"run:{other.pk}"]
        )
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL pgtrigger.ignore = '{pgtrigger_event_append_only_1de8b}'")
        assert "permission denied" in _refused(
            "DELETE FROM ledger_event WHERE chain = %s", [f"run:{other.pk}"]
        )
        # Nor through the function, for a run that is not archived…
        assert "is not archived" in _refused("SELECT saga_archived_run_events_delete(%s)", [other.pk])
        # …nor by forging a tombstone alone: the archive must be signed and on the tenant's chain.
        other.refresh_from_db()
        count = Event.objects.filter(chain=f"run:{other.pk}").count()
        with transaction.atomic():
            ArchivedRun.objects.create(
                run_id=other.pk,
                tenant=tenant,
                agent=other.agent,
                status=other.status,
                created_at=other.created_at,
                finished_at=other.finished_at,
                archived_at=other.finished_at,
                archive="file:///nowhere/manifest.json",
                manifest_sha256="0" * 64,
                head=other.audit_head,
                events=count,
            )
            assert "no signed head vouches" in _refused(
                "SELECT saga_archived_run_events_delete(%s)", [other.pk]
            )
            transaction.set_rollback(True)
        assert Event.objects.filter(chain=f"run:{other.pk}").count() == count
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")
    assert "Archive intact" in verify_archive(folder_url(acme_retention))[0]


def test_a_run_the_audit_stream_has_not_delivered_yet_is_left(acme_retention, tenant, agent):
    from recovery.audit_stream.models import AuditSink

    run = age(closed_run(tenant, agent))
    AuditSink.objects.create(
        tenant=tenant, kind=AuditSink.Kind.HEC, url="https://siem.example.com/hec", token="t"
    )
    result = runner.runs_archive()
    assert result.archived == []
    assert [(o.run_id, o.detail) for o in result.skipped] == [
        (run.pk, "the audit stream has not yet delivered its events to https://siem.example.com/hec")
    ]
    assert Run.objects.filter(pk=run.pk).exists()


def test_live_verify_audit_still_passes_for_the_rest_after_an_archive(acme_retention, tenant, agent):
    from ledger.audit_signing import audit_heads_sign

    age(closed_run(tenant, agent))
    closed_run(tenant, agent, email="live@company.com")
    audit_heads_sign()
    runner.runs_archive()
    call_command("verify_audit", stdout=StringIO(), stderr=StringIO())
