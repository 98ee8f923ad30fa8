"""The ledger's PostgreSQL functions are what ``ledger/sql`` says (``ledger.sql.versions``: one file
per version, the newest the current definition, a loaded version frozen):

- the migrated database defines each function exactly as its newest file does (compared with the
  same file loaded into a scratch schema: body, settings, SECURITY DEFINER, privileges), and no
  ``saga_*`` function the folder has no file for;
- the latest migration that loads a function loads its newest file, every version on file is
  loaded by a migration, and no migration creates a ``saga_*`` function from SQL of its own;
- a loaded version whose SQL changed is refused (its comment may change).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations import RunSQL
from django.db.migrations.loader import MigrationLoader

from ledger.sql import versions
from ledger.sql.versions import LoadFunction, VersionChanged

SCRATCH = "saga_sql_scratch"
CREATES_A_FUNCTION = re.compile(r"CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+(public\.)?saga_", re.IGNORECASE)


def _definition(schema: str, function: str) -> tuple[str, str | None]:
    """The function's full definition (``pg_get_functiondef``, its schema written as ``public``)
    and its privileges."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_functiondef(p.oid), p.proacl::text FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = %s",
            [schema, function],
        )
        rows = cursor.fetchall()
    assert len(rows) == 1, f"{schema}.{function}: {len(rows)} definitions"
    text, acl = rows[0]
    return text.replace(f"FUNCTION {schema}.", "FUNCTION public."), acl


def _migration_plan() -> list[tuple[str, object]]:
    """Every migration of every app, in an order the graph allows, with its operations."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    seen: dict[tuple[str, str], None] = {}
    for leaf in loader.graph.leaf_nodes():
        for node in loader.graph.forwards_plan(leaf):
            seen.setdefault(node, None)
    return [(f"{app}/{name}", loader.graph.nodes[(app, name)]) for app, name in seen]


def loads_problems(loads: list[tuple[str, str, int]], on_file: dict[str, list[int]]) -> list[str]:
    """What is wrong with these loads (migration, function, version, in migration order) of these
    files; empty when the migrations and the folder agree."""
    latest: dict[str, tuple[str, int]] = {}
    loaded: dict[str, set[int]] = {}
    for migration, function, version in loads:
        latest[function] = (migration, version)
        loaded.setdefault(function, set()).add(version)
    found = []
    for function, numbers in on_file.items():
        if function not in latest:
            found.append(f"{function}: no migration loads it")
            continue
        migration, version = latest[function]
        if version != numbers[-1]:
            found.append(
                f"{function}: version {numbers[-1]} is the newest file, but the latest migration that "
                f"loads it ({migration}) loads version {version}: add a migration that loads {numbers[-1]}"
            )
        found += [
            f"{function}: version {n} is on file but no migration loads it"
            for n in numbers
            if n not in loaded[function]
        ]
    found += [f"{function}: loaded, but has no file" for function in latest if function not in on_file]
    return found


def test_the_folder_holds_the_ledgers_functions():
    assert versions.newest() == {
        "saga_action_move": 1,
        "saga_action_record": 2,
        "saga_archived_run_events_delete": 2,
        "saga_event_insert": 1,
    }


@pytest.mark.django_db
def test_the_migrated_database_defines_each_function_as_its_newest_file():
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('search_path')")
        search_path = cursor.fetchone()[0]
        cursor.execute(f"CREATE SCHEMA {SCRATCH}")
        cursor.execute(f"SET LOCAL search_path = {SCRATCH}, public")
        for function, version in versions.newest().items():
            cursor.execute(versions.sql_of(function, version))
        cursor.execute("SELECT set_config('search_path', %s, true)", [search_path])
    for function in versions.newest():
        assert _definition("public", function) == _definition(SCRATCH, function), function
    # The definer function's settings, spelled out: what its file must keep.
    text, acl = _definition("public", "saga_archived_run_events_delete")
    assert "SECURITY DEFINER" in text
    assert "SET search_path TO 'pg_catalog', 'pg_temp'" in text
    # PUBLIC may not execute it (an entry without a grantee is PUBLIC's).
    assert acl is not None and not any(entry.startswith("=") for entry in acl.strip("{}").split(","))


@pytest.mark.django_db
def test_the_database_has_no_saga_function_without_a_file():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'public' AND p.proname LIKE 'saga\\_%'"
        )
        names = {row[0] for row in cursor.fetchall()}
    assert names == set(versions.newest())


def test_the_latest_migrations_load_the_newest_files_and_nothing_else_creates_a_function():
    loads, inline = [], []
    for migration, node in _migration_plan():
        for operation in node.operations:
            if isinstance(operation, LoadFunction):
                loads.append((migration, operation.function, operation.version))
            elif isinstance(operation, RunSQL) and CREATES_A_FUNCTION.search(str(operation.sql)):
                inline.append(migration)
    assert loads, "no migration loads a function: the plan was not read"
    assert loads_problems(loads, versions.versions()) == []
    assert inline == [], "these migrations create a saga_ function without a file in ledger/sql"


def test_the_check_of_the_loads_finds_each_mismatch():
    on_file = {"saga_f": [1, 2]}
    assert loads_problems([("ledger/0001", "saga_f", 1), ("ledger/0002", "saga_f", 2)], on_file) == []
    # A new version on file without its migration; a version skipped; a file nobody loads.
    assert loads_problems([("ledger/0001", "saga_f", 1)], on_file) == [
        "saga_f: version 2 is the newest file, but the latest migration that loads it (ledger/0001) "
        "loads version 1: add a migration that loads 2",
        "saga_f: version 2 is on file but no migration loads it",
    ]
    assert loads_problems([("ledger/0002", "saga_f", 2)], on_file) == [
        "saga_f: version 1 is on file but no migration loads it"
    ]
    assert loads_problems([], on_file) == ["saga_f: no migration loads it"]


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text, "utf-8")


def test_a_loaded_version_whose_sql_changed_is_refused(tmp_path):
    body = "CREATE OR REPLACE FUNCTION saga_f() RETURNS int LANGUAGE sql AS 'SELECT 1';\n"
    _write(tmp_path, "saga_f.v1.sql", "-- what it does\n" + body)
    digest = versions.digest(body)
    assert versions.frozen_sql("saga_f", 1, digest, tmp_path) == body
    # Its comment is documentation: corrected, the version is the same.
    _write(tmp_path, "saga_f.v1.sql", "-- what it does, and why\n--\n" + body)
    assert versions.frozen_sql("saga_f", 1, digest, tmp_path) == body
    _write(tmp_path, "saga_f.v1.sql", "-- what it does\n" + body.replace("1", "2"))
    with pytest.raises(
        VersionChanged, match=r"saga_f\.v1\.sql is not the SQL its migration loads.*version 2"
    ):
        versions.frozen_sql("saga_f", 1, digest, tmp_path)


def test_a_file_that_is_not_a_version_is_refused(tmp_path):
    _write(tmp_path, "saga_f.sql", "")
    with pytest.raises(ValueError, match=r"saga_f\.sql: not <function>\.v<N>\.sql"):
        versions.versions(tmp_path)
