"""The server's release, from its one source: ``version`` in pyproject.toml.

An installed server (the image, ``pip install .``) reads it from its distribution's metadata, which
pip wrote from pyproject.toml. A source tree run as it is (a checkout, or a release's ``git
archive`` run with ``PYTHONPATH``, as the upgrade test runs the previous release) reads the
pyproject.toml beside its packages: the venv's metadata would name whatever release was installed
into it, not the code that runs. CHANGELOG.md says what each release changed and how to upgrade.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "saga-admin"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@functools.cache
def server_version() -> str:
    """``0.2.0``; ``unknown`` only for code that is neither installed nor in a source tree."""
    try:
        project = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    if project.get("name") == DISTRIBUTION and isinstance(project.get("version"), str):
        return str(project["version"])
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
