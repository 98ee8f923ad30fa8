"""`pip install ./clients/python`, as docs/INTEGRATING.md says, does not break `make lint`.

That install builds in the source folder and leaves clients/python/build/lib/saga_client: a second
copy of every client module, which `mypy .` found too and stopped on ("Duplicate module named
saga_client"). pyproject's [tool.mypy] exclude and [tool.ruff] extend-exclude skip build/
folders. The check: the client's sources and the project's pyproject.toml copied to a temporary
folder laid out as the repository is (not a git repository, so .gitignore helps nobody there),
the documented install run on that copy for real, then mypy's and ruff's own file discovery with
the project's configuration on it. The same mypy discovery without the exclude finds each module
twice, so this test fails if the exclude goes. Discovery rather than a whole `mypy` run: the
duplicate is a discovery error, and type-checking the client again would add half a minute and
prove nothing more.
"""

from __future__ import annotations

import collections
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mypy.config_parser import parse_config_file
from mypy.find_sources import create_source_list
from mypy.fscache import FileSystemCache
from mypy.options import Options

from tests.support.processes import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _modules(tree: Path, *, exclude: bool) -> collections.Counter[str]:
    options = Options()
    parse_config_file(options, lambda: None, str(tree / "pyproject.toml"), io.StringIO(), io.StringIO())
    assert options.exclude, "pyproject.toml's [tool.mypy] has no exclude"
    if not exclude:
        options.exclude = []
    return collections.Counter(
        source.module for source in create_source_list([str(tree)], options, FileSystemCache())
    )


def test_the_documented_client_install_leaves_nothing_mypy_or_ruff_sees_twice(tmp_path):
    tree = tmp_path / "repo"
    shutil.copytree(
        ROOT / "clients" / "python",
        tree / "clients" / "python",
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*cache"),
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(tmp_path / "site"),
            "./clients/python",
        ],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    copy = tree / "clients" / "python" / "build" / "lib" / "saga_client" / "__init__.py"
    assert copy.is_file(), "the install left no build/ copy: this test no longer reproduces the problem"

    twice = [module for module, count in _modules(tree, exclude=False).items() if count > 1]
    assert "saga_client" in twice  # without the exclude, the problem is there
    modules = _modules(tree, exclude=True)
    assert modules["saga_client"] == 1 and "saga_client.client" in modules
    assert [module for module, count in modules.items() if count > 1] == []

    listed = subprocess.run(
        [str(Path(sys.executable).parent / "ruff"), "check", "--show-files", "."],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    files = listed.stdout.splitlines()
    assert any(line.endswith("saga_client/client.py") for line in files), listed.stdout
    assert [line for line in files if "/build/" in line] == []
