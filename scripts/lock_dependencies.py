"""Writes constraints.txt: the server's runtime dependencies, every one of them (pyproject.toml's
``dependencies`` and what they pull in, with the extras asked for), each at the version installed
in this venv, where the suite ran against it.

    .venv/bin/python scripts/lock_dependencies.py           # or: make lock
    .venv/bin/python scripts/lock_dependencies.py --check   # exit 1 when constraints.txt differs

pip reads it as a constraints file (``pip install -c constraints.txt .``): the image's install
(deploy/docker/install.sh) and ``make install`` take these versions, so what ships is what was
tested; tests/test_dependency_lock.py holds it to pyproject.toml's ranges and to this venv.
Upgrading a dependency: widen or raise its range in pyproject.toml if needed, ``pip install -U`` it
into the venv, run the suite, then ``make lock`` and commit both files together.

Markers are evaluated for this interpreter (CPython 3.11 on Linux, as in the image), so a
dependency only another platform needs is not listed.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
HEADER = """\
# The server's runtime dependencies, pinned: pyproject.toml's `dependencies` and everything they
# pull in, at the versions the suite ran against (CPython 3.11, Linux). Generated from the venv by
# `make lock` (scripts/lock_dependencies.py); do not edit by hand. pip reads it as a constraints
# file: `pip install -c constraints.txt .` (deploy/docker/install.sh, make install).
"""


def runtime_requirements(root: Path = ROOT) -> list[Requirement]:
    """pyproject.toml's ``[project] dependencies``, as written (no optional extras)."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(text) for text in project["dependencies"]]


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    environment = default_environment()
    return any(
        requirement.marker.evaluate({**environment, "extra": extra})  # type: ignore[dict-item]
        for extra in (extras or {""})
    )


def resolved(roots: list[Requirement]) -> dict[str, str]:
    """Every distribution ``roots`` need in this environment, name (canonical) to installed version.
    A requirement nothing here satisfies is an error: the venv is not the one the lock describes."""
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [
        (requirement, set(requirement.extras)) for requirement in roots if _applies(requirement, set())
    ]
    while pending:
        requirement, extras = pending.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{requirement} is required but not installed in this venv") from None
        version = distribution.version
        if not requirement.specifier.contains(version, prereleases=True):
            raise SystemExit(f"{requirement} is required but {requirement.name} {version} is installed")
        found[name] = version
        for text in distribution.requires or []:
            child = Requirement(text)
            if _applies(child, extras):
                pending.append((child, set(child.extras)))
    return found


def render(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """constraints.txt's pins, name (canonical) to version."""
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            name, _, version = text.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = render(resolved(runtime_requirements()))
    if args.check:
        if LOCK.exists() and LOCK.read_text(encoding="utf-8") == text:
            return 0
        print(
            "constraints.txt is not what this venv resolves: run `make lock` (after `make install` "
            "if pyproject.toml changed) and commit it.",
            file=sys.stderr,
        )
        return 1
    LOCK.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
