"""docs/README.md's map of the code ("Where things are") matches the tree, both ways: every module
of the server's packages has a row, and every path a row names exists.

The server's packages are the ones pyproject.toml installs (``[tool.setuptools.packages.find]``),
``demo`` aside (the map gives it one row as a folder), so a new top-level package is mapped the day
it is installed. Their modules are every ``.py`` file except a package's ``__init__.py`` (a
docstring naming its modules), migrations, tests and management commands (``management/commands/``:
each app's ``management/`` row names its commands).

A row names paths in its first column, in code spans: a span with a ``/`` inside it is a path from
the repository's root; a bare name (``rule_words.py``, ``openai_agents/``) after a path in the
same cell is that path's sibling, and first in its cell is at the root (``Dockerfile``).

When a module moves, the failure lists exactly the rows to add and the paths to fix.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "README.md"
HEADING = "## Where things are"
NOT_MAPPED_ONE_BY_ONE = {"demo"}
# Top-level packages that are not the server: the bench harness and the suite.
OUTSIDE_THE_SERVER = {"bench", "tests"}


def server_packages(root: Path = ROOT) -> list[str]:
    found = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = found["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({pattern.rstrip("*.") for pattern in patterns} - NOT_MAPPED_ONE_BY_ONE)


def modules(root: Path = ROOT) -> set[str]:
    """Every module the map must name, as a path from the root."""
    found = set()
    for package in server_packages(root):
        for path in (root / package).rglob("*.py"):
            relative = path.relative_to(root)
            parts = relative.parts
            if path.name == "__init__.py" or "migrations" in parts or "tests" in parts:
                continue
            if "management" in parts and "commands" in parts:
                continue
            found.add(relative.as_posix())
    return found


def _section(text: str) -> str:
    assert f"\n{HEADING}\n" in text, f"docs/README.md lacks the section {HEADING!r}"
    section = text.split(f"\n{HEADING}\n", 1)[1]
    # The map runs to the next section of the same level (its ### tables are inside it).
    return re.split(r"\n## ", section, maxsplit=1)[0]


def named_paths(text: str) -> set[str]:
    """The paths the map's rows name in their first column (folders keep their trailing /)."""
    named = set()
    for line in _section(text).splitlines():
        cells = line.split("|")
        if not line.startswith("|") or len(cells) < 3 or set(cells[1].strip()) <= {"-", ":"}:
            continue
        previous: PurePosixPath | None = None
        for span in re.findall(r"`([^`]+)`", cells[1]):
            from_root = "/" in span.rstrip("/") or previous is None
            path = PurePosixPath(span) if from_root or previous is None else previous.parent / span
            previous = path
            named.add(path.as_posix() + ("/" if span.endswith("/") else ""))
    return named


def map_problems(root: Path = ROOT) -> list[str]:
    named = named_paths((root / "docs" / "README.md").read_text(encoding="utf-8"))
    missing = sorted(modules(root) - named)
    absent = sorted(path for path in named if not (root / path.rstrip("/")).exists())
    problems = []
    if missing:
        problems.append(
            "modules with no row in docs/README.md's map (add a row each):\n"
            + "\n".join(f"  {m}" for m in missing)
        )
    if absent:
        problems.append(
            "the map names paths that do not exist (moved or removed? fix their rows):\n"
            + "\n".join(f"  {a}" for a in absent)
        )
    return problems


def test_the_map_names_every_module_and_only_paths_that_exist() -> None:
    problems = map_problems()
    assert not problems, "\n".join(problems)


def test_every_top_level_package_is_installed_or_named_as_outside_the_server() -> None:
    """A new top-level package (``infra/``, say) is mapped only once pyproject.toml installs it: one
    left out of the install would be missing from the map without a word."""
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    outside = packages - set(server_packages()) - NOT_MAPPED_ONE_BY_ONE
    assert outside <= OUTSIDE_THE_SERVER, (
        f"top-level packages neither installed by pyproject.toml nor named in {__name__}'s "
        f"OUTSIDE_THE_SERVER: {sorted(outside - OUTSIDE_THE_SERVER)}"
    )


def test_the_check_finds_a_missing_module_and_a_stale_row(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools.packages.find]\ninclude = ["app*", "demo*"]\n', encoding="utf-8"
    )
    for module in ("app/__init__.py", "app/kept.py", "app/sub/new.py", "app/sub/old_sibling.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("", encoding="utf-8")
    for skipped in ("app/migrations/0001_initial.py", "app/management/commands/go.py", "demo/x.py"):
        (tmp_path / skipped).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / skipped).write_text("", encoding="utf-8")
    (tmp_path / "docs" / "README.md").write_text(
        "# Docs\n\n## Where things are\n\n| module | what |\n|---|---|\n"
        "| `app/kept.py`, `app/sub/gone.py`, `old_sibling.py` | x |\n"
        "| `app/management/` | the commands |\n\n## Next\n\n| `app/sub/new.py` | not the map |\n",
        encoding="utf-8",
    )
    assert map_problems(tmp_path) == [
        "modules with no row in docs/README.md's map (add a row each):\n  app/sub/new.py",
        "the map names paths that do not exist (moved or removed? fix their rows):\n  app/sub/gone.py",
    ]
