"""docs/API.md describes the API the code serves: the same operations as the OpenAPI document.

Endpoints are written in docs/API.md as "`GET /api/v1/runs/{run_id}`" (a code span, method then
path). Path parameters are compared by position only (``{id}`` and ``{run_id}`` are the same).
The section "Promised in the contract, not built yet" names endpoints that must NOT exist yet; once
one is built, it moves up into the endpoint tables.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

DOC = Path(__file__).resolve().parent.parent / "docs" / "API.md"
NOT_BUILT_HEADING = "## Promised in the contract, not built yet"
METHODS = ("get", "post", "put", "patch", "delete")
MENTION = re.compile(r"`(GET|POST|PUT|PATCH|DELETE)\s+(/api/v1/[^`\s?]*)[^`]*`")

Operation = tuple[str, str]


def _normalised(method: str, path: str) -> Operation:
    return method.upper(), re.sub(r"\{[^}]*\}", "{}", path).rstrip("/")


def _mentions(text: str) -> set[Operation]:
    return {_normalised(method, path) for method, path in MENTION.findall(text)}


def _doc_parts() -> tuple[str, str]:
    """(everything but the not-built section, the not-built section)."""
    text = DOC.read_text(encoding="utf-8")
    start = text.find(NOT_BUILT_HEADING)
    assert start != -1, f"docs/API.md lacks the section {NOT_BUILT_HEADING!r}"
    following = text.find("\n## ", start + len(NOT_BUILT_HEADING))
    end = len(text) if following == -1 else following
    return text[:start] + text[end:], text[start:end]


@pytest.fixture(scope="module")
def served() -> set[Operation]:
    response = Client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    operations = {
        _normalised(method, path)
        for path, item in response.json()["paths"].items()
        for method in item
        if method in METHODS
    }
    assert operations, "the OpenAPI document lists no operations"
    return operations


def test_it_documents_every_operation_the_api_serves(served):
    documented, _ = _doc_parts()
    missing = served - _mentions(documented)
    assert not missing, f"served but not in docs/API.md: {sorted(missing)}"


def test_it_documents_only_operations_the_api_serves(served):
    documented, _ = _doc_parts()
    mentioned = _mentions(documented)
    assert mentioned, "docs/API.md mentions no `METHOD /api/v1/...` endpoint"
    unknown = mentioned - served
    assert not unknown, f"in docs/API.md but not served (move them to 'not built yet'): {sorted(unknown)}"


def test_it_lists_as_not_built_only_what_the_api_does_not_serve(served):
    _, not_built = _doc_parts()
    built = _mentions(not_built) & served
    assert not built, f"listed as not built but served (document them instead): {sorted(built)}"
