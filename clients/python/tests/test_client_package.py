"""The distribution itself: Python 3.9 syntax, httpx as its only dependency, no Django anywhere."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import saga_client

PACKAGE = Path(saga_client.__file__).resolve().parent
DISTRIBUTION = PACKAGE.parent


def test_every_module_parses_as_python_3_9():
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) >= 6
    for module in modules:
        ast.parse(module.read_text(encoding="utf-8"), filename=str(module), feature_version=(3, 9))


def _resolved(*requirements: str) -> dict[str, str]:
    """What pip would install into an empty environment for ``requirements`` (from the registry)."""
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--report",
            "-",
            *requirements,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.stdout)["install"]
    }


def test_installing_the_client_brings_httpx_and_its_dependencies_only():
    client = _resolved(str(DISTRIBUTION))
    httpx_alone = _resolved(f"httpx=={client['httpx']}")
    assert "django" not in client
    assert set(client) - {"saga-admin-client"} == set(httpx_alone)


def test_importing_the_client_does_not_import_django():
    code = "import sys, saga_client; assert not any(m.split('.')[0] == 'django' for m in sys.modules), sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
