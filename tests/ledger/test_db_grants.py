"""The least-privileged application role (docs/SECURITY.md): with the grants `db_grants` prints,
the application works, and the audit log can only be read and appended to, whatever the role
tries: no UPDATE, DELETE or TRUNCATE, no disabling of the triggers, no pgtrigger bypass."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from ledger.models import Event, Run
from tests.factories import make_run

ROLE = "saga_app_probe"


@pytest.fixture
def as_app_role(db):
    """Inside the test's transaction (CREATE ROLE is transactional: it is rolled back with it)."""
    out = StringIO()
    call_command("db_grants", role=ROLE, stdout=out)
    statements = [line for line in out.getvalue().splitlines() if line.strip()]
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {ROLE} NOLOGIN")
        for statement in statements:
            cursor.execute(statement)
        cursor.execute(f"SET ROLE {ROLE}")
    yield statements
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")


def _refused(sql: str) -> str:
    with pytest.raises(DatabaseError) as excinfo, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
    return str(excinfo.value)


def test_the_application_records_a_run_as_the_least_privileged_role(as_app_role, tenant, agent):
    run = make_run(tenant, agent)
    assert Run.objects.filter(pk=run.pk).exists()
    assert Event.objects.filter(run=run).exists()


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM ledger_event",
        "UPDATE ledger_event SET reason = 'rewritten'",
        "TRUNCATE ledger_event",
        "ALTER TABLE ledger_event DISABLE TRIGGER ALL",
        "DROP TRIGGER pgtrigger_event_append_only_1de8b ON ledger_event",
    ],
)
def test_the_role_cannot_rewrite_the_audit_log(as_app_role, tenant, agent, sql):
    make_run(tenant, agent)
    count = Event.objects.count()
    message = _refused(sql)
    assert "permission denied" in message or "must be owner" in message
    assert Event.objects.count() == count > 0


def test_the_role_cannot_grant_itself_more(as_app_role, tenant, agent):
    # PostgreSQL answers a non-owner's GRANT with a warning, not an error: what counts is after.
    make_run(tenant, agent)
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT DELETE, TRUNCATE ON ledger_event TO {ROLE}")
    assert "permission denied" in _refused("DELETE FROM ledger_event")


def test_pgtriggers_bypass_does_not_help_the_role(as_app_role, tenant, agent):
    # Any role may set pgtrigger's ignore variable; the missing privilege still stops it.
    make_run(tenant, agent)
    with connection.cursor() as cursor:
        cursor.execute("SET pgtrigger.ignore = '{pgtrigger_event_append_only_1de8b}'")
    assert "permission denied" in _refused("DELETE FROM ledger_event")


def test_the_audit_log_is_granted_read_and_append_only(as_app_role):
    assert 'GRANT SELECT, INSERT ON "ledger_event" TO "saga_app_probe";' in as_app_role
    assert 'GRANT SELECT, INSERT, UPDATE, DELETE ON "ledger_run" TO "saga_app_probe";' in as_app_role


def test_a_role_name_that_is_not_an_identifier_is_refused(db):
    with pytest.raises(CommandError, match="letters, digits and underscores"):
        call_command("db_grants", role="x; DROP TABLE ledger_run")
