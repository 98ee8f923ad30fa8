"""docs/DEPLOY.md names only what exists: every ``SAGA_*``, ``REDIS_*`` and ``DB_*`` variable is
read by the code or set by a shipped file, every management command it runs is one and takes the
flags it is given, and every repository path, test file and test it cites exists. The checks are
tests/test_docs_operations.py's, on this doc."""

from __future__ import annotations

import re

from django.core.management import get_commands, load_command_class

from tests.test_docs_operations import ROOT, _code, _exists
from tests.test_docs_security import _tests_in

DOC = ROOT / "docs" / "DEPLOY.md"

# How the doc runs a management command: installed, by manage.py, or through the image's
# entrypoint (`docker compose run --rm migrate NAME`, `docker run … saga-admin NAME`). The tail is
# the rest of the code span or the line: its `--flags`.
COMMAND = re.compile(
    r"(?:python -m saga_admin|python manage\.py|run --rm migrate|docker run [^`\n]*? saga-admin)"
    r"\s+(\w+)([^`\n]*)"
)
# Files at the top of the repository, named on their own.
TOP_LEVEL = re.compile(
    r"`(Procfile|Dockerfile|Makefile|\.dockerignore|\.env\.example|compose\.yaml|constraints\.txt|pyproject\.toml)`"
)


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_every_variable_it_names_is_read_by_the_code() -> None:
    code = _code()
    named = set(re.findall(r"\b(?:SAGA|REDIS|DB)_[A-Z0-9_]*[A-Z0-9]\b", _doc()))
    assert len(named) > 25
    missing = []
    for name in sorted(named):
        if name in code:
            continue
        # NAME_FILE: any secret read through infra.env.env_secret("NAME") takes it.
        base = name.removesuffix("_FILE")
        if base != name and f'env_secret("{base}"' in code:
            continue
        # Spelled as a prefix and a suffix: ENV = "SAGA_BOOTSTRAP_", then ENV + "TENANT_NAME".
        if any(
            f'"{name[: i + 1]}"' in code and f'+ "{name[i + 1 :]}"' in code
            for i, char in enumerate(name)
            if char == "_"
        ):
            continue
        missing.append(name)
    assert missing == [], f"docs/DEPLOY.md names variables the code never reads: {missing}"


def test_every_command_it_runs_exists_and_takes_its_flags() -> None:
    commands = get_commands()
    runs = COMMAND.findall(_doc())
    assert len(runs) >= 20
    wrong = []
    for name, tail in runs:
        if name not in commands:
            wrong.append(name)
            continue
        parser = load_command_class(commands[name], name).create_parser("python -m saga_admin", name)
        wrong += [
            f"{name} {flag}"
            for flag in re.findall(r"(?<![^\s[])(--[\w-]+)", tail)
            if flag not in parser._option_string_actions
        ]
    assert wrong == [], f"docs/DEPLOY.md runs commands or flags that do not exist: {wrong}"
    assert {"migrate", "db_grants", "bootstrap", "verify_audit", "create_agent_key"} <= {n for n, _ in runs}


def test_every_test_it_cites_exists() -> None:
    cited = set(re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?", _doc()))
    assert len(cited) >= 8
    for module, test in sorted(cited):
        path = ROOT / module
        assert path.exists(), f"docs/DEPLOY.md cites {module}, which does not exist"
        if test:
            assert test in _tests_in(path), f"docs/DEPLOY.md cites {module}::{test}, which does not exist"


def test_every_repository_path_it_names_exists() -> None:
    text = _doc()
    named = set(
        re.findall(
            r"(?<![\w/.])((?:deploy|infra|saga_admin|recovery|ledger|dashboard|scripts)/[\w./-]*[\w/])", text
        )
    )
    named |= set(TOP_LEVEL.findall(text))
    assert len(named) >= 10
    missing = sorted(path for path in named if not _exists(path.rstrip("/")))
    assert missing == [], f"docs/DEPLOY.md names paths that do not exist: {missing}"
