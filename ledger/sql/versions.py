"""The versions of the ledger's PostgreSQL functions (``ledger/sql/<function>.v<N>.sql``), read and
loaded by migrations.

A migration loads one version of a function (``LoadFunction``), never "the function's file": it
runs again on every fresh database, long after it was written, and must create what it created
then (PL/pgSQL resolves a row type such as ``ledger_action`` when the function is created, so
today's text can fail against yesterday's tables). A version, once a migration loads it, is
frozen: the migration names the SHA-256 of its SQL and refuses a file whose SQL differs. A file
starts with a comment (what the function does, and why), which is documentation: it is not run,
not hashed, and may be corrected at any time.

To change a function: copy its newest file to the next version, change that, and add a migration
that loads it with ``LoadFunction(name, N, sha256=…, previous=(N - 1, …))`` (``python -m ledger.sql
<function> <N>`` prints the digest). ``tests/ledger/test_sql_functions.py`` holds the migrated
database to the newest files and the newest files to the latest migrations.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from django.db import migrations

FOLDER = Path(__file__).resolve().parent
_FILE_NAME = re.compile(r"^(?P<function>saga_[a-z_]+)\.v(?P<version>[1-9][0-9]*)\.sql$")


class VersionChanged(RuntimeError):
    """A version's SQL is not the SQL its migration was written with."""


def path_of(function: str, version: int, folder: Path = FOLDER) -> Path:
    return folder / f"{function}.v{version}.sql"


def versions(folder: Path = FOLDER) -> dict[str, list[int]]:
    """Each function's versions on file, in order."""
    found: dict[str, list[int]] = {}
    for path in folder.glob("*.sql"):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ValueError(f"{path.name}: not <function>.v<N>.sql")
        found.setdefault(match["function"], []).append(int(match["version"]))
    return {function: sorted(numbers) for function, numbers in sorted(found.items())}


def newest(folder: Path = FOLDER) -> dict[str, int]:
    """Each function's current version: its newest file."""
    return {function: numbers[-1] for function, numbers in versions(folder).items()}


def sql_of(function: str, version: int, folder: Path = FOLDER) -> str:
    """What a version's file runs: the file without its leading comment lines."""
    lines = path_of(function, version, folder).read_text("utf-8").splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].lstrip().startswith("--"):
        start += 1
    return "".join(lines[start:])


def digest(sql: str) -> str:
    return hashlib.sha256(sql.encode()).hexdigest()


def frozen_sql(function: str, version: int, sha256: str, folder: Path = FOLDER) -> str:
    """The version's SQL, if it is still what its migration was written with."""
    sql = sql_of(function, version, folder)
    if digest(sql) != sha256:
        raise VersionChanged(
            f"{path_of(function, version, folder).name} is not the SQL its migration loads (sha256 "
            f"{sha256[:16]}…, the file's is {digest(sql)[:16]}…): a loaded version never changes; "
            f"put the change in version {newest(folder).get(function, version) + 1} and a migration that loads it"
        )
    return sql


class LoadFunction(migrations.RunSQL):
    """``CREATE OR REPLACE`` a function as one version's file says. Reversed: the ``previous``
    version (its number and SHA-256), or ``reverse_sql`` (the first version: drop it)."""

    def __init__(
        self,
        function: str,
        version: int,
        *,
        sha256: str,
        previous: tuple[int, str] | None = None,
        reverse_sql: str | None = None,
    ) -> None:
        if (previous is None) == (reverse_sql is None):
            raise ValueError("LoadFunction: give either previous or reverse_sql")
        self.function, self.version, self.sha256 = function, version, sha256
        self.previous = previous
        reverse = frozen_sql(function, *previous) if previous is not None else reverse_sql
        super().__init__(frozen_sql(function, version, sha256), reverse)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"sha256": self.sha256}
        if self.previous is not None:
            kwargs["previous"] = self.previous
        else:
            kwargs["reverse_sql"] = self.reverse_sql
        return (self.__class__.__qualname__, [self.function, self.version], kwargs)

    def describe(self) -> str:
        return f"Load {self.function} version {self.version} (ledger/sql)"
