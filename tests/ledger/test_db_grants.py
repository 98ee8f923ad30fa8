"""The least-privileged application role (docs/SECURITY.md): with the grants `db_grants` prints,
the application works, and the audit log can only be read and appended to, whatever the role
tries: no UPDATE, DELETE or TRUNCATE, no disabling of the triggers, no pgtrigger bypass."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from ledger.models import Event, Run
from tests.factories import make_run
from tests.support.processes import database_url_for_subprocesses

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


# --- db_grants --apply: what the migrate step runs, as the owner ------------------------------

APPLIED = "saga_app_applied"


def _apply(**options) -> str:
    out = StringIO()
    call_command("db_grants", apply=True, stdout=out, **options)
    return out.getvalue()


def test_apply_creates_the_urls_role_and_grants_it_once_and_again(db, monkeypatch, tenant, agent):
    # The migrate step's view: it connects as the owner, and knows the application's DATABASE_URL.
    monkeypatch.setenv("SAGA_APP_DATABASE_URL", f"postgres://{APPLIED}:s3cret%21@db.internal:5432/saga")
    assert "Created the role and granted saga_app_applied" in _apply(create=True)
    assert _apply(create=True).startswith("Granted saga_app_applied what the application needs")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s",
            [APPLIED],
        )
        assert cursor.fetchone() == (True, False, False, False)
        cursor.execute(
            "SELECT rolpassword LIKE 'SCRAM-SHA-256$%%' FROM pg_authid WHERE rolname = %s", [APPLIED]
        )
        assert cursor.fetchone() == (True,)
        cursor.execute(f"SET ROLE {APPLIED}")
    try:
        make_run(tenant, agent)
        assert "permission denied" in _refused("DELETE FROM ledger_event")
        assert "must be owner" in _refused("ALTER TABLE ledger_event DISABLE TRIGGER ALL")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ROLE")


def test_apply_without_create_needs_the_role_to_exist(db):
    with pytest.raises(CommandError, match="does not exist: create it first"):
        _apply(role=APPLIED)


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (f"CREATE ROLE {APPLIED} LOGIN SUPERUSER", "is a superuser"),
        (f"CREATE ROLE {APPLIED} LOGIN IN ROLE current_user", "is a member of"),
        (
            f"CREATE ROLE {APPLIED} LOGIN; CREATE TABLE saga_owned_by_app (id int);"
            f" ALTER TABLE saga_owned_by_app OWNER TO {APPLIED}",
            "owns 1 object(s)",
        ),
    ],
)
def test_apply_refuses_a_role_that_could_disable_the_triggers(db, setup, reason):
    with connection.cursor() as cursor:
        for statement in setup.split("; "):
            cursor.execute(statement.replace("current_user", connection.settings_dict["USER"]))
    with pytest.raises(CommandError, match=re.escape(reason)):
        _apply(role=APPLIED)


def test_apply_refuses_the_owner_itself(db, monkeypatch):
    # One DATABASE_URL for everything, the mistake the shipped files used to make.
    monkeypatch.setenv("SAGA_APP_DATABASE_URL", database_url_for_subprocesses())
    with pytest.raises(CommandError, match="is the role running this command"):
        _apply(create=True)


def test_without_a_role_or_an_application_url_it_says_what_to_give(db, monkeypatch):
    monkeypatch.delenv("SAGA_APP_DATABASE_URL", raising=False)
    with pytest.raises(CommandError, match="--role, or SAGA_APP_DATABASE_URL"):
        call_command("db_grants")
