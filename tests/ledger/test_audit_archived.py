"""verify_audit and the runs retention archived (tests/support/archived.py leaves exactly what
the archiver does): an honest archive passes — its chain has no events and no run left, its
signed heads outlive them — and every way of passing off a deleted run as archived, or of leaving
an archive half done, is named."""

from __future__ import annotations

from io import StringIO

import pgtrigger
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from ledger import audit_signing
from ledger.audit import Actor, audit_record
from ledger.models import ArchivedRun, Event, Run, SignedHead
from ledger.services import runs
from tests.factories import make_run, record
from tests.support.archived import archive_run_for_test

KEY = "test-audit-key-0123456789abcdef"
ARCHIVE = "s3://saga-archive/acme/2026/11/run.manifest.json"


@pytest.fixture
def keyed(settings):
    settings.AUDIT_KEY = KEY
    return settings


@pytest.fixture
def finished(tenant, agent) -> Run:
    """A failed run of three events, its first two signed by an ordinary pass (that head stays
    after the archive, naming an event that is gone); the archive signs the third."""
    run = make_run(tenant, agent)
    record(run, agent, "k1")
    audit_signing.audit_heads_sign()
    runs.run_fail(run=run, actor=agent, error="boom")
    return run


def _verify(*args: str) -> str:
    out = StringIO()
    call_command("verify_audit", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _verify_fails(*args: str) -> str:
    err = StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("verify_audit", *args, stdout=StringIO(), stderr=err)
    assert excinfo.value.returncode == 1
    return str(excinfo.value) + "\n" + err.getvalue()


def _delete_run(run: Run) -> None:
    """What a deletion (not an archive) leaves: nothing of the run, its signed heads aside."""
    with pgtrigger.ignore("ledger.Event:event_append_only"):
        Event.objects.filter(chain=f"run:{run.pk}").delete()
    Run.objects.filter(pk=run.pk).delete()


def _tombstone(run: Run, **fields) -> ArchivedRun:
    """An archive record written by hand for ``run`` (what a forger with the application's role
    may INSERT), claiming its current chain unless told otherwise."""
    head = Event.objects.filter(chain=f"run:{run.pk}").order_by("-id").values_list("hash", flat=True).first()
    values = {
        "tenant_id": run.tenant_id,
        "agent": run.agent,
        "owner": run.owner,
        "status": run.status,
        "created_at": run.created_at,
        "finished_at": run.finished_at or timezone.now(),
        "archived_at": timezone.now(),
        "archive": ARCHIVE,
        "manifest_sha256": "0" * 64,
        "head": head or "",
        "events": Event.objects.filter(chain=f"run:{run.pk}").count(),
        **fields,
    }
    return ArchivedRun.objects.create(run_id=run.pk, **values)


def test_an_honest_archive_passes_with_its_heads_verified(keyed, finished):
    tombstone = archive_run_for_test(finished, ARCHIVE)
    assert (tombstone.events, SignedHead.objects.filter(chain=f"run:{finished.pk}").count()) == (3, 2)
    out = _verify()
    assert "1 archived run checked" in out
    assert "Audit log intact" in out
    # The archive head, and the tenant chain's (signed before: its new event is not yet signed).
    assert "2 signed heads verified." in out
    assert "Audit log intact" in _verify("--chain", f"run:{finished.pk}")
    assert "Audit log intact" in _verify("--chain", f"tenant:{finished.tenant_id}")


def test_a_length_a_signing_pass_had_signed_stands_for_the_archive_head(keyed, finished):
    """Pass: when the ordinary pass signed the whole chain before the archive, that head (one row
    per chain and length) is the one the archive is held against."""
    audit_signing.audit_heads_sign()
    archive_run_for_test(finished, ARCHIVE)
    assert not SignedHead.objects.filter(chain=f"run:{finished.pk}", reason="archive").exists()
    assert "Audit log intact" in _verify()


def test_an_archive_without_a_key_passes_unsigned(finished, settings):
    settings.AUDIT_KEY = ""
    archive_run_for_test(finished, ARCHIVE)
    out = _verify()
    assert "1 archived run checked" in out and "Chain heads unsigned" in out


def test_a_deleted_run_is_named(keyed, finished):
    """Pass: a run whose rows and events are gone, with no archive record, is a deleted run: its
    signed heads give it away."""
    _delete_run(finished)
    failure = _verify_fails()
    assert f"chain run:{finished.pk}: its signed heads" in failure
    assert "the run was deleted" in failure


def test_a_tombstone_without_its_tenant_event_is_named(keyed, finished):
    """Pass: a deletion dressed up as an archive by inserting an ArchivedRun row alone: no
    run.archived event in its tenant's chain vouches for it, and no head was signed when it was
    'archived'."""
    _tombstone(finished)
    _delete_run(finished)
    failure = _verify_fails()
    assert f"archived run {finished.pk}" in failure
    assert "holds no run.archived event for it" in failure
    assert "no head of its chain was signed at the 3 events it was archived with" in failure
    assert "the run was deleted" not in failure


def test_a_tenant_event_that_does_not_match_the_tombstone_is_named(keyed, finished):
    """Pass: the run.archived event says one archive, the tombstone another (its URL, its length)."""
    tombstone = _tombstone(finished)
    audit_record(
        tenant=finished.tenant,
        actor=Actor.system("retention"),
        kind="run.archived",
        subject=f"run:{finished.pk}",
        data={
            "run": finished.pk,
            "head": tombstone.head,
            "events": tombstone.events - 1,
            "archive": "s3://elsewhere/run.manifest.json",
            "manifest_sha256": tombstone.manifest_sha256,
        },
    )
    _delete_run(finished)
    failure = _verify_fails()
    assert "run.archived event does not match its archive record (events, archive differ)" in failure


def test_events_and_a_run_left_behind_are_named(keyed, finished):
    """Pass: a tombstone for a run that is still there (an archive that did not remove it, or a
    tombstone written to hide a live run): its row and events are named."""
    _tombstone(finished)
    failure = _verify_fails()
    assert "its run row is still in the database" in failure
    assert "events of its chain are still in the log" in failure


def test_a_forged_archive_head_signature_is_named(keyed, finished):
    archive_run_for_test(finished, ARCHIVE)
    with pgtrigger.ignore("ledger.SignedHead:signed_head_append_only"):
        SignedHead.objects.filter(chain=f"run:{finished.pk}", reason="archive").update(signature="f" * 64)
    failure = _verify_fails()
    assert (
        "the head signed at the 3 events it was archived with has a signature that does not verify" in failure
    )


def test_an_archive_head_that_is_not_the_tombstones_is_named(keyed, finished):
    archive_run_for_test(finished, ARCHIVE)
    with pgtrigger.ignore("ledger.SignedHead:signed_head_append_only"):
        SignedHead.objects.filter(chain=f"run:{finished.pk}", reason="archive").update(head="a" * 64)
    failure = _verify_fails()
    assert (
        "the head signed at the 3 events it was archived with (aaaaaaaaaaaaaaaa…) is not the archive record's"
        in failure
    )


def test_a_signed_head_beyond_the_archived_length_is_named(keyed, finished):
    """Pass: a head signed at a position past what the run was archived with means the archive
    left events out."""
    tombstone = archive_run_for_test(finished, ARCHIVE)
    SignedHead.objects.create(
        tenant_id=tombstone.tenant_id,
        chain=f"run:{finished.pk}",
        position=tombstone.events + 2,
        event_id=10**9,
        head="b" * 64,
        signed_at=timezone.now(),
        key_id="x",
        signature="c" * 64,
    )
    failure = _verify_fails()
    assert "a signed head at position 5 is beyond the 3 events it was archived with" in failure


def test_the_tombstones_are_read_a_page_at_a_time_and_none_is_missed(keyed, tenant, agent, monkeypatch):
    # Pages of one tombstone over three archived runs (and filtered to one run or tenant), then a
    # fourth passed off as archived, named.
    archived = []
    for n in range(4):
        run = make_run(tenant, agent)
        record(run, agent, f"page-{n}")
        runs.run_fail(run=run, actor=agent, error="boom")
        archived.append(run)
    for run in archived[:3]:
        archive_run_for_test(run, ARCHIVE)
    monkeypatch.setattr(audit_signing, "_CHUNK", 1)
    assert "3 archived runs checked" in _verify()
    assert "1 archived run checked" in _verify("--chain", f"run:{archived[1].pk}")
    assert "3 archived runs checked" in _verify("--chain", f"tenant:{tenant.pk}")
    _tombstone(archived[3])
    _delete_run(archived[3])
    failure = _verify_fails()
    assert f"archived run {archived[3].pk}" in failure and "holds no run.archived event for it" in failure
