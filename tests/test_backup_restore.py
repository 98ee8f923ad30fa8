"""Backup and restore as docs/DEPLOY.md tells an operator to do it: ``pg_dump -Fc`` of a live
database, ``pg_restore`` into a new, empty one, then ``verify_audit`` against the copy. The copy's
audit chains verify end to end (every run's recorded head included), the append-only trigger came
back with the schema, and a change slipped into the copy behind the trigger's back is caught, so
the check really read the restored rows."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from ledger.models import Event
from tests.factories import gated_run, onboarding_run
from tests.support.processes import database_url_for_subprocesses

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def restored_database() -> Iterator[str]:
    """The name of a new, empty database on the same server; dropped afterwards."""
    name = f"saga_restore_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(database_url_for_subprocesses("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(database_url_for_subprocesses("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def _verify_audit(database_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url}
    return _run([str(ROOT / ".venv" / "bin" / "python"), "manage.py", "verify_audit"], env=env)


def test_a_restored_dump_verifies_its_audit_chains(
    tenant, agent, tmp_path: Path, restored_database: str
) -> None:
    onboarding_run(tenant, agent)
    gated_run(tenant, agent)
    events = Event.objects.count()
    assert events > 10
    dump = tmp_path / "saga.dump"
    source = database_url_for_subprocesses(connection.settings_dict["NAME"])
    dumped = _run(["pg_dump", "--format=custom", "--no-owner", f"--file={dump}", source])
    assert dumped.returncode == 0, dumped.stderr
    copy = database_url_for_subprocesses(restored_database)
    restored = _run(["pg_restore", "--no-owner", "--exit-on-error", f"--dbname={copy}", str(dump)])
    assert restored.returncode == 0, restored.stderr

    verified = _verify_audit(copy)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"{events} events checked." in verified.stdout and "intact" in verified.stdout

    with psycopg.connect(copy, autocommit=True) as conn:
        # The append-only protection was restored with the schema.
        with pytest.raises(psycopg.errors.RaiseException, match="Cannot update or delete"):
            conn.execute("UPDATE ledger_event SET reason = 'rewritten'")
        # Behind the trigger's back (as only a superuser can), one event's words changed.
        conn.execute("ALTER TABLE ledger_event DISABLE TRIGGER USER")
        conn.execute(
            "UPDATE ledger_event SET reason = 'nothing to see here' WHERE id = (SELECT max(id) FROM ledger_event)"
        )
        conn.execute("ALTER TABLE ledger_event ENABLE TRIGGER USER")
    tampered = _verify_audit(copy)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr
    assert "the event's content does not match its hash" in tampered.stderr
