"""The SQL that gives the application's own database role exactly what it needs, and no more.

Run migrations as the role that owns the tables; run the web and worker processes as another role
that owns nothing. A role that does not own a table cannot drop or disable its triggers, alter it
or grant itself more; on the audit log it may only read and append.

Printed by default (to read, or to pipe into psql as the owner); ``--apply`` runs them itself, as
the role it connects as (the owner: the migrate step's ``DATABASE_URL``), after checking that the
application's role owns nothing and cannot become the owner, and ``--create`` makes that role
first when it does not exist. The role is ``--role``, or the user of ``SAGA_APP_DATABASE_URL``
(the web's and the worker's ``DATABASE_URL``, given to the migrate step under this name), so the
role granted is the one the processes log in as (docs/DEPLOY.md, "The database roles").
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection, transaction
from psycopg import sql

from infra.env import env_secret
from ledger.models import ArchivedRun, Event, SignedHead

# The application's DATABASE_URL as the migrate step knows it (which connects as the owner).
APP_URL_VARIABLE = "SAGA_APP_DATABASE_URL"

# The functions the application may call that do what its own privileges do not allow, each
# checking for itself that it may: retention's removal of an archived run's audit events
# (ledger/sql). PostgreSQL lets every role execute a new function; their files revoke that.
DEFINER_FUNCTIONS = ("saga_archived_run_events_delete(text)",)

# Tables the application only appends to and reads.
APPEND_ONLY = frozenset({Event._meta.db_table, SignedHead._meta.db_table, ArchivedRun._meta.db_table})


def grants_for(role: str) -> list[str]:
    quoted = connection.ops.quote_name(role)
    tables = sorted(
        {
            model._meta.db_table
            for model in apps.get_models(include_auto_created=True)
            if model._meta.managed and not model._meta.proxy
        }
        & set(connection.introspection.table_names())
    )
    statements = [
        # No role but the owner creates objects in ``public``: an object there (an operator, a
        # function, a table shadowing one) is found by name by whoever's search_path lists the
        # schema, a SECURITY DEFINER function once among them. PostgreSQL 15
        # and later start without PUBLIC's CREATE there; a cluster upgraded from before keeps it.
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC;",
        f"REVOKE CREATE ON SCHEMA public FROM {quoted};",
        f"GRANT CONNECT ON DATABASE {connection.ops.quote_name(connection.settings_dict['NAME'])} TO {quoted};",
        f"GRANT USAGE ON SCHEMA public TO {quoted};",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {quoted};",
    ]
    for table in tables:
        privileges = "SELECT, INSERT" if table in APPEND_ONLY else "SELECT, INSERT, UPDATE, DELETE"
        statements.append(f"GRANT {privileges} ON {connection.ops.quote_name(table)} TO {quoted};")
    # django_migrations: read by `migrate --check` and `showmigrations`; only the owner writes it.
    statements.append(f"GRANT SELECT ON django_migrations TO {quoted};")
    with connection.cursor() as cursor:
        for function in DEFINER_FUNCTIONS:
            cursor.execute("SELECT to_regprocedure(%s) IS NOT NULL", [function])
            if cursor.fetchone()[0]:
                # Again here, not only in the function's file: a restore with --no-acl (or a
                # restore as another owner) brings PUBLIC's default EXECUTE back.
                statements.append(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC;")
                statements.append(f"GRANT EXECUTE ON FUNCTION {function} TO {quoted};")
    return statements


def _app_login() -> tuple[str, str | None]:
    """The role (and password, if any) of SAGA_APP_DATABASE_URL (or _FILE)."""
    try:
        url = env_secret(APP_URL_VARIABLE)
    except ImproperlyConfigured as exc:
        raise CommandError(str(exc)) from None
    if not url:
        raise CommandError(f"Name the application's role: --role, or {APP_URL_VARIABLE} (its DATABASE_URL).")
    parts = urlsplit(url)
    if not parts.username:
        raise CommandError(f"{APP_URL_VARIABLE} names no user: the application's role logs in by name.")
    return unquote(parts.username), unquote(parts.password) if parts.password else None


def _why_unsafe(role: str) -> str | None:
    """Why ``role`` would void the audit log's protection, or None: it is the connecting role
    (the owner), a superuser, a member of the owner (SET ROLE away), or owns something here."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        owner = cursor.fetchone()[0]
        if role == owner:
            return f"{role} is the role running this command (the owner of the tables)"
        cursor.execute("SELECT oid, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s", [role])
        row = cursor.fetchone()
        if row is None:
            return None
        oid, superuser, bypassrls = row
        if superuser or bypassrls:
            return f"{role} is a superuser" if superuser else f"{role} bypasses row security"
        cursor.execute("SELECT pg_has_role(%s, current_user, 'MEMBER')", [role])
        if cursor.fetchone()[0]:
            return f"{role} is a member of {owner}, the owner, and may act as it"
        cursor.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relowner = %(oid)s)"
            " + (SELECT count(*) FROM pg_proc WHERE proowner = %(oid)s)"
            " + (SELECT count(*) FROM pg_namespace WHERE nspowner = %(oid)s)"
            " + (SELECT count(*) FROM pg_database WHERE datdba = %(oid)s AND datname = current_database())",
            {"oid": oid},
        )
        owned = cursor.fetchone()[0]
        if owned:
            return (
                f"{role} owns {owned} object(s) of this database (tables, functions, schemas or the database)"
            )
    return None


def _create(role: str, password: str | None) -> bool:
    """``role`` made (LOGIN, nothing more) unless it exists; True if it was made."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cursor.fetchone():
            return False
        statement = sql.SQL(
            "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
        ).format(sql.Identifier(role))
        if password is not None:
            statement += sql.SQL(" PASSWORD {}").format(sql.Literal(password))
        try:
            with transaction.atomic():
                cursor.execute(statement.as_string(cursor.connection))
        except Exception as exc:  # insufficient privilege, mostly: say what to do
            raise CommandError(
                f"Could not create the role {role} ({str(exc).strip()}): create it as a superuser "
                f"(CREATE ROLE {role} LOGIN PASSWORD '…'), or give the migrating role CREATEROLE."
            ) from None
    return True


class Command(BaseCommand):
    help = (
        "Print (or with --apply, run) the GRANT and REVOKE statements for the least-privileged "
        "application role (as the tables' owner, after each migrate; no role but the owner creates "
        "in public). The role may read and append to the audit log, never "
        "update, delete or truncate it, and owns nothing, so it cannot drop or disable triggers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--role",
            help=f"The role the web and worker processes log in as (default: {APP_URL_VARIABLE}'s user).",
        )
        parser.add_argument(
            "--apply",
            action="store_true",
            help="Run the statements (as this connection's role, the owner) instead of printing them; "
            "refused if the role owns anything, is a superuser or may become the owner.",
        )
        parser.add_argument(
            "--create",
            action="store_true",
            help=f"With --apply: create the role (LOGIN, with {APP_URL_VARIABLE}'s password) if it "
            "does not exist. An existing role is left as it is.",
        )

    def handle(self, *args: Any, role: str | None, apply: bool, create: bool, **options: Any) -> None:
        password = None
        if role is None:
            role, password = _app_login()
        if not role.replace("_", "").isalnum():
            raise CommandError("--role: letters, digits and underscores only.")
        if create and not apply:
            raise CommandError("--create goes with --apply.")
        if not apply:
            for statement in grants_for(role):
                self.stdout.write(statement)
            return
        unsafe = _why_unsafe(role)
        if unsafe:
            raise CommandError(
                f"Refusing to grant {role}: {unsafe}. The web and worker must log in as a role that "
                "owns nothing, or the audit log's triggers are theirs to disable (docs/DEPLOY.md)."
            )
        created = create and _create(role, password)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if not cursor.fetchone():
                raise CommandError(f"The role {role} does not exist: create it first, or pass --create.")
        statements = grants_for(role)
        with transaction.atomic(), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
        made = "Created the role and granted" if created else "Granted"
        self.stdout.write(f"{made} {role} what the application needs ({len(statements)} statements).")
