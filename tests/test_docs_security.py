"""docs/SECURITY.md names the test behind every claim: each named test module and test exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "SECURITY.md"
# `security/test_x.py::test_y`, `::test_z` (same module as the previous one), `ledger/test_w.py`
REFERENCE = re.compile(r"`(?:(?P<module>[\w/]+/test_\w+\.py))?(?:::(?P<test>test_\w+))?`")


def _tests_in(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
    }


def test_every_test_the_threat_model_names_exists():
    text = DOC.read_text()
    module: Path | None = None
    named = 0
    for match in REFERENCE.finditer(text):
        if match.group("module"):
            module = ROOT / "tests" / match.group("module")
            assert module.exists(), f"docs/SECURITY.md names {match.group('module')}, which does not exist"
        if match.group("test"):
            assert module is not None, f"{match.group('test')} is named before any module"
            assert match.group("test") in _tests_in(module), (
                f"docs/SECURITY.md names {module.relative_to(ROOT)}::{match.group('test')}, which does not exist"
            )
            named += 1
    assert named >= 20
