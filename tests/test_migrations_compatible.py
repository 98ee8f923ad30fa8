"""Upgrades without downtime: every migration must work with the previous release's code still
running (expand now, contract one release later), as docs/README.md ("Migrations") says.

django-migration-linter reads the SQL each migration of the project's own apps runs
(``sqlmigrate`` against the real PostgreSQL, RunSQL's text included) and refuses what the code
of the release before cannot live with: a dropped or renamed column or table, a column altered
to another type, a NOT NULL column the old code's INSERTs leave out (a Python-only ``default``:
Django drops the database default after filling the rows; ``db_default`` keeps it), a new unique
constraint. Such a migration fails this test unless ``ACCEPTED`` below marks it with a one-line
reason; a mark on a migration the linter does not refuse fails too, so the list stays true.

The linter's warnings (an index built without CONCURRENTLY locks writes, a RunSQL or RunPython
without a reverse) are shown in its report but fail nothing.
"""

from __future__ import annotations

import io
import textwrap
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.db.migrations import Migration
from django.test import override_settings
from django_migration_linter import MigrationLinter

pytestmark = pytest.mark.django_db

ROOT = Path(settings.BASE_DIR)

# The migrations written before the rule that the linter refuses, each accepted with why. A new
# migration belongs here only when it cannot be split into expand and contract (and the release
# notes say the upgrade needs the old processes stopped first).
ACCEPTED: dict[tuple[str, str], str] = {
    ("ledger", "0003_run_audit_head"): (
        "adds run.audit_head NOT NULL with a Python-only default (0004 gave it db_default ''); before the rule"
    ),
    ("ledger", "0011_mcp_compensator"): (
        "adds compensator.headers_env and mcp_tool NOT NULL with Python-only defaults; before the rule"
    ),
    ("ledger", "0012_rules_limits_owner"): (
        "adds toolpolicy.approvers, limits and rules NOT NULL with Python-only defaults; before the rule"
    ),
}


class _Linter(MigrationLinter):
    """The linter, keeping each refused migration's report instead of only printing it."""

    def __init__(self, app_labels: list[str]) -> None:
        # No path: no cache file in the user's home; no output of its own (the report is kept).
        super().__init__(None, include_apps=app_labels)
        self.refused: dict[tuple[str, str], str] = {}

    def lint_migration(self, migration: Migration) -> None:
        erroneous = self.nb_erroneous
        out = io.StringIO()
        with redirect_stdout(out):
            super().lint_migration(migration)
        if self.nb_erroneous > erroneous:
            self.refused[(migration.app_label, migration.name)] = out.getvalue().strip()


def problems(app_labels: list[str], accepted: dict[tuple[str, str], str]) -> list[str]:
    """What is wrong with these apps' migrations under these marks; empty when the gate passes."""
    linter = _Linter(app_labels)
    linter.lint_all_migrations()
    found = []
    for key, report in sorted(linter.refused.items()):
        reason = accepted.get(key, "")
        if not reason.strip() or "\n" in reason:
            found.append(
                f"{key[0]}/{key[1]} is not backward compatible (mark it with a one-line reason in "
                f"tests/test_migrations_compatible.py's ACCEPTED, or split it: docs/README.md):\n{report}"
            )
    found += [
        f"{key[0]}/{key[1]} is marked but the linter does not refuse it: remove its mark"
        for key in sorted(accepted)
        if key[0] in app_labels and key not in linter.refused
    ]
    return found


def project_apps() -> list[str]:
    """The apps whose package is at the repository's root, or inside one of those (the audit stream's
    ``recovery.audit_stream``); third-party apps lint themselves."""
    return sorted(
        config.label
        for config in apps.get_app_configs()
        if ROOT in (Path(config.path).parent, Path(config.path).parent.parent)
        and (Path(config.path) / "migrations").is_dir()
    )


def test_the_project_apps_are_all_linted() -> None:
    assert {"ledger", "recovery", "demo", "audit_stream"} <= set(project_apps())


def test_every_project_migration_is_compatible_or_marked_with_a_reason() -> None:
    found = problems(project_apps(), ACCEPTED)
    assert not found, "\n\n".join(found)


# A throwaway app, registered only for one test: its 0001 creates a table, its 0002 is the case.
INITIAL = """
from django.db import migrations, models

class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.CreateModel(
            name="Thing",
            fields=[
                ("id", models.BigAutoField(primary_key=True)),
                ("name", models.CharField(max_length=50)),
                ("note", models.TextField(null=True)),
            ],
        ),
    ]
"""

SECOND = """
from django.db import migrations, models

class Migration(migrations.Migration):
    dependencies = [("{label}", "0001_initial")]
    operations = [{operation}]
"""

# Contract steps, and expand steps done wrong: the old code breaks on each.
REFUSED = {
    "drop_column": 'migrations.RemoveField("thing", "note")',
    "rename_field": 'migrations.RenameField("thing", "name", "title")',
    "not_null_python_default": 'migrations.AddField("thing", "size", models.IntegerField(default=0))',
    "alter_type": 'migrations.AlterField("thing", "note", models.IntegerField(null=True))',
    "drop_table": 'migrations.DeleteModel("thing")',
    "set_not_null": 'migrations.AlterField("thing", "note", models.TextField(default=""))',
    "add_unique": 'migrations.AlterField("thing", "name", models.CharField(max_length=50, unique=True))',
    "runsql_drop_column": 'migrations.RunSQL("ALTER TABLE {label}_thing DROP COLUMN note", migrations.RunSQL.noop)',
}

# Expand steps: the old code runs on as before.
PASSED = {
    "nullable_column": 'migrations.AddField("thing", "size", models.IntegerField(null=True))',
    "db_default_column": 'migrations.AddField("thing", "size", models.IntegerField(db_default=0, default=0))',
    "new_table": 'migrations.CreateModel("Other", [("id", models.BigAutoField(primary_key=True))])',
    "runsql_new_function": (
        "migrations.RunSQL(\"CREATE OR REPLACE FUNCTION {label}_one() RETURNS int LANGUAGE sql AS 'SELECT 1'\","
        ' "DROP FUNCTION {label}_one()")'
    ),
}


@pytest.fixture
def probe_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: Any) -> Any:
    """Writes the app ``lintprobe_<case>`` with the case as its 0002 and installs it for the test."""

    def install(case: str, operation: str) -> str:
        label = f"lintprobe_{case}"
        package = tmp_path / label
        (package / "migrations").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "migrations" / "__init__.py").write_text("")
        (package / "migrations" / "0001_initial.py").write_text(textwrap.dedent(INITIAL))
        second = SECOND.format(label=label, operation=operation.format(label=label))
        (package / "migrations" / f"0002_{case}.py").write_text(second)
        monkeypatch.syspath_prepend(str(tmp_path))
        overridden = override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, label])
        overridden.enable()
        request.addfinalizer(overridden.disable)
        return label

    return install


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_gate_refuses_an_incompatible_migration_until_it_is_marked(case: str, probe_app: Any) -> None:
    label = probe_app(case, REFUSED[case])
    key = (label, f"0002_{case}")

    [problem] = problems([label], {})
    assert problem.startswith(f"{label}/0002_{case} is not backward compatible")
    assert problems([label], {key: ""}) != []
    assert problems([label], {key: "two\nlines"}) != []

    assert problems([label], {key: "dropped one release after the code stopped using it"}) == []


@pytest.mark.parametrize("case", sorted(PASSED))
def test_the_gate_lets_an_expand_migration_through_unmarked(case: str, probe_app: Any) -> None:
    label = probe_app(case, PASSED[case])
    assert problems([label], {}) == []
    # A mark where none is needed is refused: the list names only what the linter refuses.
    assert problems([label], {(label, f"0002_{case}"): "not needed"}) == [
        f"{label}/0002_{case} is marked but the linter does not refuse it: remove its mark"
    ]
