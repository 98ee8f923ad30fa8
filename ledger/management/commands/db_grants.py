"""The SQL that gives the application's own database role exactly what it needs, and no more.

Run migrations as the role that owns the tables; run the web and worker processes as another role
that owns nothing. A role that does not own a table cannot drop or disable its triggers, alter it
or grant itself more; on the audit log it may only read and append.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from ledger.models import ArchivedRun, Event, SignedHead

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
                statements.append(f"GRANT EXECUTE ON FUNCTION {function} TO {quoted};")
    return statements


class Command(BaseCommand):
    help = (
        "Print the GRANT (and REVOKE) statements for a least-privileged application role (run "
        "them as the tables' owner after each migrate; no role but the owner creates in public). "
        "The role may read and append to the audit log, never "
        "update, delete or truncate it, and owns nothing, so it cannot drop or disable triggers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--role", required=True, help="The role the web and worker processes log in as.")

    def handle(self, *args: Any, role: str, **options: Any) -> None:
        if not role.replace("_", "").isalnum():
            raise CommandError("--role: letters, digits and underscores only.")
        for statement in grants_for(role):
            self.stdout.write(statement)
