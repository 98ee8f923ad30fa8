"""The one SECURITY DEFINER function (``saga_archived_run_events_delete``, which
retention calls to remove an archived run's audit events) cannot be made to run the application
role's code as its owner.

The attack, as the application's least-privileged role (``db_grants``) on a cluster upgraded from
before PostgreSQL 15, where PUBLIC may still create objects in ``public``: plant an operator
``public.=(varchar, text)``, an exact match for the function's ``ledger_run.id = p_run_id``, whose
code grants the role DELETE and TRUNCATE on the audit log when it runs as anyone else; then let
retention archive a run. The fix is twofold and each half is tried: ``db_grants`` revokes CREATE on
``public`` (the plant is refused), and the function's search_path is ``pg_catalog, pg_temp`` (an
operator planted before the revoke is never resolved)."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from ledger.models import Event, Run
from recovery.archive import runner
from tests.recovery.archive_support import KEY, age, allow, closed_run, folder_url, retention

pytestmark = pytest.mark.django_db

ROLE = "saga_app_hijacker"

PLANT = f"""
CREATE FUNCTION public.saga_hijack_eq(varchar, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> '{ROLE}' THEN  -- run by someone else: the definer function's owner
        EXECUTE 'GRANT DELETE, TRUNCATE ON public.ledger_event TO {ROLE}';
    END IF;
    RETURN $1::text OPERATOR(pg_catalog.=) $2;
END
$$;
CREATE OPERATOR public.= (LEFTARG = varchar, RIGHTARG = text, FUNCTION = public.saga_hijack_eq);
"""


@pytest.fixture
def upgraded_cluster(db, settings, tmp_path: Path, tenant) -> None:
    """PUBLIC's CREATE on ``public``, as a cluster initialised before PostgreSQL 15 keeps it (the
    test's transaction rolls it back); the application role, not yet granted anything; Acme's
    retention (closed runs kept a day) into an allowed folder."""
    settings.AUDIT_KEY = KEY
    base = tmp_path / "archive"
    base.mkdir()
    allow(settings, folder_url(base))
    retention(tenant, folder_url(base))
    with connection.cursor() as cursor:
        cursor.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        cursor.execute(f"CREATE ROLE {ROLE} NOLOGIN")


def _grant_and_become_the_app_role() -> None:
    out = StringIO()
    call_command("db_grants", role=ROLE, stdout=out)
    with connection.cursor() as cursor:
        for statement in out.getvalue().splitlines():
            cursor.execute(statement)
        cursor.execute(f"SET ROLE {ROLE}")


def _reset_role() -> None:
    with connection.cursor() as cursor:
        cursor.execute("RESET ROLE")


def _may(privilege: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_table_privilege(%s, 'public.ledger_event', %s)", [ROLE, privilege])
        return bool(cursor.fetchone()[0])


def _retention_runs_and_the_log_stays_append_only(tenant, agent) -> None:
    run = age(closed_run(tenant, agent))
    other = closed_run(tenant, agent, email="other@company.com")  # young: stays
    kept = Event.objects.filter(chain=f"run:{other.pk}").count()
    assert [o.run_id for o in runner.runs_archive().archived] == [run.pk]
    assert not Run.objects.filter(pk=run.pk).exists()
    assert not _may("DELETE") and not _may("TRUNCATE")
    refused = pytest.raises(DatabaseError, match="permission denied")
    with refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("TRUNCATE ledger_event")
    assert Event.objects.filter(chain=f"run:{other.pk}").count() == kept > 0


def test_the_application_role_cannot_plant_an_operator_in_public(upgraded_cluster, tenant, agent):
    _grant_and_become_the_app_role()
    try:
        refused = pytest.raises(DatabaseError, match="permission denied for schema public")
        with refused, transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(PLANT)
        _retention_runs_and_the_log_stays_append_only(tenant, agent)
    finally:
        _reset_role()


def test_an_operator_planted_before_the_revoke_is_not_resolved_by_the_definer_function(
    upgraded_cluster, tenant, agent
):
    # Planted while PUBLIC's CREATE still stood (before db_grants was first run on the cluster).
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {ROLE}")
        cursor.execute(PLANT)
        cursor.execute("RESET ROLE")
    _grant_and_become_the_app_role()
    try:
        _retention_runs_and_the_log_stays_append_only(tenant, agent)
    finally:
        _reset_role()


def test_db_grants_revokes_create_on_public(db):
    out = StringIO()
    call_command("db_grants", role=ROLE, stdout=out)
    lines = out.getvalue().splitlines()
    assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC;" in lines
    assert f'REVOKE CREATE ON SCHEMA public FROM "{ROLE}";' in lines
