"""The archiver SIGKILLed mid-batch (``manage.py archive_runs`` as a real process): every run is
then either live (its row there, its audit chain whole) or archived (its tombstone there, its
archive verifying), never lost and never half; a re-run finishes the batch and everything
verifies. Killed again just after a run's files are written and before its removal commits: that
run is live, and the next pass writes its files again. To a file URL and to a real S3 API
(``moto_server``), read back through the archiver's own storage."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ledger.archive.destinations import Destination, destination_parse
from ledger.archive.storage import Storage, storage_for
from ledger.audit import audit_verify
from ledger.models import ArchivedRun, Event, Run, SignedHead
from ledger.services import runs
from tests.factories import make_run, record
from tests.recovery.archive_support import KEY, age, allow, closed_run, folder_url, retention, verify_archive
from tests.support.processes import ROOT, database_url_for_subprocesses, wait_for
from tests.support.s3 import CREDENTIALS, S3Server, s3, s3_server  # noqa: F401 - a real S3 API (moto_server)

pytestmark = pytest.mark.timeout(300)

RUNS = 50


def _runs(tenant, agent) -> list[str]:
    made = [closed_run(tenant, agent, email=f"full{n}@company.com").pk for n in range(3)]
    for n in range(RUNS - len(made)):
        run = make_run(tenant, agent)
        for k in range(4):
            record(run, agent, f"crash-{n}-{k}", args={"n": n, "k": k, "pad": "x" * 2000})
        runs.run_complete(run=run, actor=agent, summary="done")
        made.append(run.pk)
    for run_id in made:
        age(Run.objects.get(pk=run_id))
    return made


@dataclass
class Store:
    """Where the archives go: its URL, what the archiver process needs to reach it, and the
    archiver's own storage to read them back."""

    url: str
    env: dict[str, str]
    s3_endpoint: str = ""

    @property
    def base(self) -> Destination:
        return destination_parse(self.url)

    @property
    def storage(self) -> Storage:
        return storage_for(self.base, s3_endpoint_url=self.s3_endpoint)

    def manifests(self) -> set[str]:
        """The runs whose manifest is there (their folder's name)."""
        return {found.segments[-2] for found in self.storage.find(self.base, "manifest.json")}

    def read(self, url: str) -> bytes:
        return self.storage.get(destination_parse(url))


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path, settings) -> Store:
    if request.param == "file":
        base = tmp_path / "archive"
        base.mkdir()
        made = Store(url=folder_url(base), env={})
    else:
        s3: S3Server = request.getfixturevalue("s3")
        made = Store(
            url=f"s3://{s3.new_bucket()}/saga",
            env={**CREDENTIALS, "SAGA_ARCHIVE_S3_ENDPOINT_URL": s3.endpoint},
            s3_endpoint=s3.endpoint,
        )
        settings.SAGA = {**settings.SAGA, "ARCHIVE_S3_ENDPOINT_URL": s3.endpoint}
    allow(settings, made.url)
    return made


def _archiver(store: Store, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **store.env,
        "DATABASE_URL": database_url_for_subprocesses(),
        "DB_CONN_MAX_AGE": "0",
        "SAGA_AUDIT_KEY": KEY,
        "SAGA_ARCHIVE_ALLOWED_URLS": store.url,
        "LOG_LEVEL": "WARNING",
    }
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "archive_runs", "--limit", "1000"],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _kill(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _live_or_archived(run_ids: list[str], store: Store) -> tuple[int, int]:
    """Each run is exactly one of: live and whole, or archived and verifiable. (live, archived)."""
    live = archived = 0
    for run_id in run_ids:
        run = Run.objects.filter(pk=run_id).first()
        tomb = ArchivedRun.objects.filter(run_id=run_id).first()
        chain = f"run:{run_id}"
        if run is not None:
            assert tomb is None, f"{run_id} is both live and archived"
            events = list(Event.objects.filter(chain=chain).order_by("id"))
            assert events and events[-1].hash == run.audit_head, f"{run_id}'s chain lost events"
            assert audit_verify(chain=chain)[1] is None, f"{run_id}'s chain is broken"
            assert run.actions.count() == (4 if run.summary == "done" else run.actions.count())
            live += 1
            continue
        assert tomb is not None, f"{run_id} is lost: neither live nor archived"
        assert not Event.objects.filter(chain=chain).exists(), f"{run_id} is half removed"
        assert hashlib.sha256(store.read(tomb.archive)).hexdigest() == tomb.manifest_sha256
        assert SignedHead.objects.filter(chain=chain, position=tomb.events, head=tomb.head).exists()
        assert Event.objects.filter(kind="run.archived", subject_id=run_id, data__head=tomb.head).exists()
        archived += 1
    # Every archive there verifies offline (those of live runs too: written, not yet committed).
    if store.manifests():
        assert "Archive intact" in verify_archive(store.url)[0]
    return live, archived


def test_the_archiver_killed_mid_batch_leaves_every_run_live_or_archived(
    transactional_db, tenant, agent, tmp_path, settings, store
):
    settings.AUDIT_KEY = KEY
    retention(tenant, store.url)
    run_ids = _runs(tenant, agent)
    log = tmp_path / "archiver.log"

    # 1. Killed once some runs are archived.
    process = _archiver(store, log)
    wait_for(
        lambda: ArchivedRun.objects.count() >= 5 or process.poll() is not None,
        timeout=120,
        interval=0.01,
        what="the archiver to archive its first runs",
    )
    _kill(process)
    live, archived = _live_or_archived(run_ids, store)
    assert 0 < archived < RUNS, (
        f"the kill came too late to prove anything ({archived} archived)\n{log.read_text()}"
    )

    # 2. Killed again as soon as a run's files are written and its removal not yet committed.
    before = store.manifests()
    process = _archiver(store, log)

    def written_not_committed() -> bool:
        written = store.manifests() - before
        return (
            bool(written - set(ArchivedRun.objects.values_list("run_id", flat=True)))
            or process.poll() is not None
        )

    wait_for(written_not_committed, timeout=120, interval=0.001, what="a run's files to be written")
    _kill(process)
    live, archived = _live_or_archived(run_ids, store)
    assert archived < RUNS, f"the second kill came too late ({archived} archived)\n{log.read_text()}"

    # 3. A re-run finishes the batch: every run archived, every archive verifies.
    finish = _archiver(store, log)
    assert finish.wait(timeout=240) == 0, log.read_text()
    assert _live_or_archived(run_ids, store) == (0, RUNS)
    out, _ = verify_archive(store.url)
    assert f"{RUNS} archived runs checked" in out
