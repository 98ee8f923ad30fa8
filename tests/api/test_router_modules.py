"""The API's layout: one router module per resource, none importing another (what they share is
in saga_admin.api.common and saga_admin.api.schemas), each mounted by saga_admin.api.app."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from django.test import Client

import saga_admin.api

API = Path(saga_admin.api.__file__).parent


def _router_modules() -> dict[str, Path]:
    found = {}
    for path in sorted(API.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "router" for t in node.targets
            ):
                found[f"saga_admin.api.{path.stem}"] = path
    return found


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_it_finds_the_routers():
    assert {"saga_admin.api.runs", "saga_admin.api.queue"} <= set(_router_modules())


def test_no_router_imports_another():
    routers = _router_modules()
    crossing = {
        module: sorted(_imports(path) & (set(routers) - {module})) for module, path in routers.items()
    }
    assert {module: targets for module, targets in crossing.items() if targets} == {}


def test_the_api_mounts_every_router_module():
    served = set(Client().get("/api/v1/openapi.json").json()["paths"])
    for name in _router_modules():
        router = importlib.import_module(name).router
        assert router.path_operations, name
        missing = {f"/api/v1{path}" for path in router.path_operations} - served
        assert not missing, (name, missing)
