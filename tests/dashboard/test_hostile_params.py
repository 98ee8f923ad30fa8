"""Whatever an operator's browser (or a hand-edited URL) sends, a page answers 2xx/3xx/4xx."""

from __future__ import annotations

import base64
import json

import pytest
from django.test import Client

HOSTILE = [
    "",
    "0",
    "-1",
    "4385971160033",
    "9" * 400,
    "'; DROP TABLE ledger_run; --",
    "%",
    "\u202e\u0000",
    "2026-13-45T99:99:99",
    "9999-12-31T23:59:59+00:00",
    "bm9uc2Vuc2U=",
    "a" * 5000,
]


def _cursor(values: object) -> str:
    """A cursor shaped like the ones the pages hand out, holding ``values``."""
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


# Well-formed cursors (base64 of a JSON list of the right length) with values no page handed out:
# they pass the decoding a raw string fails at, so they test what reaches the database.
HOSTILE += [
    _cursor(["2026-13-45T00:00:00", "rec_01m80000000000000000000000"]),
    _cursor(["2026-11-22T00:00:00+99:00", "rec_01m80000000000000000000000"]),
    _cursor(["2026-11-22T00:00:00+00:00", "rec_\u0000"]),
    _cursor(["2026-11-22T00:00:00+00:00", 7]),
    _cursor([True, "2026-11-22T00:00:00+00:00", "rec_01m80000000000000000000000"]),
    _cursor([3, "2026-11-22T00:00:00", "x" * 5000]),
    # JSON nested deeper than the parser's stack: a RecursionError, not a ValueError.
    base64.urlsafe_b64encode(b"[" * 5000).decode(),
]

PARAMS = {
    "/": ["cursor", "q", "tenant", "risk", "reason", "status", "age", "sort"],
    "/queue/new": ["since", "tenant", "risk", "reason", "status", "age", "q"],
    "/insights/": ["window", "tenant"],
    "/approvals/": ["tenant", "cursor", "approval", "decide"],
}


@pytest.fixture
def operator(alice):
    client = Client()
    client.force_login(alice)
    return client


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_no_query_value_breaks_a_page(operator, value):
    failures = []
    for path, names in PARAMS.items():
        for name in names:
            response = operator.get(path, {name: value})
            if response.status_code >= 500:
                failures.append((path, name, response.status_code))
    assert failures == []


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_no_selected_item_id_breaks_the_bulk_form(operator, value):
    """Item ids posted by the queue's bulk form are the client's: one that cannot exist is a 404
    like one that does not, never a database error."""
    response = operator.post("/queue/bulk", {"operation": "close", "reason": "cleanup", "items": [value]})
    assert response.status_code < 500
