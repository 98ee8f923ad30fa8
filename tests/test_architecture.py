from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_it_keeps_the_record_independent_of_the_decisions():
    """DESIGN.md: recovery/ uses ledger/, never the other way round (the record does not know what
    is decided about it). The agent API composes both from saga_admin/."""
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if n.split(".")[0] in {"recovery", "dashboard"}
        )
        for path in (ROOT / "ledger").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_it_keeps_the_client_free_of_django():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if n.split(".")[0] in {"django", "ledger", "recovery", "ninja"}
        )
        for path in (ROOT / "saga_admin" / "client").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}
