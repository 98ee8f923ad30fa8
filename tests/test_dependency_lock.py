"""The release's dependencies: constraints.txt pins every runtime dependency of the server (and
what those pull in) within pyproject.toml's ranges, at the versions this venv (the suite's) runs;
every runtime dependency has an upper bound below its next major release; and the server's version
has one source. The image installs from the lock: tests/test_install.py checks the installed
versions against it."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "lock_dependencies.py"
sys.path.insert(0, str(SCRIPT.parent))
import lock_dependencies  # noqa: E402

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_lock_is_what_this_venv_resolves():
    """``make lock`` would write the committed file: nothing missing, nothing stale."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_lock_pins_every_runtime_dependency_within_its_range():
    pins = lock_dependencies.read_lock()
    for requirement in lock_dependencies.runtime_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"
        )
    # An extra asked for is locked too (psycopg[binary] installs psycopg-binary).
    assert "psycopg-binary" in pins
    # Only the server's: no test tool, no development extra.
    assert not {"pytest", "ruff", "mypy", "schemathesis", "playwright"} & set(pins)


def test_the_resolution_follows_what_each_dependency_pulls_in():
    """Not only the direct dependencies: what they require, as installed here."""
    pins = lock_dependencies.resolved([Requirement("django-ninja")])
    assert {"django-ninja", "django", "pydantic", "pydantic-core", "asgiref", "sqlparse"} <= set(pins)
    locked = lock_dependencies.read_lock()
    assert all(locked[name] == version for name, version in pins.items())


def test_every_runtime_dependency_stops_below_a_breaking_release():
    """A range without an upper bound lets the next major release (which may remove what we call)
    into a fresh install; exact pins count as bounded."""
    unbounded = []
    for text in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        operators = {spec.operator for spec in requirement.specifier}
        if not operators & {"<", "<=", "==", "~=", "==="}:
            unbounded.append(text)
    assert unbounded == []


def test_the_version_has_one_source_and_the_changelog_names_it():
    from infra.version import server_version

    version = PYPROJECT["project"]["version"]
    assert server_version() == version
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## [{version}]" in changelog, "CHANGELOG.md has no entry for pyproject.toml's version"
    done = subprocess.run(
        [sys.executable, "-m", "saga_admin", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.strip() == f"saga-admin {version}", done
