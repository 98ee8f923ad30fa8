"""Whatever an operator's browser (or a hand-edited URL) sends, a page answers 2xx/3xx/4xx."""

from __future__ import annotations

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

PARAMS = {
    "/": ["cursor", "q", "tenant", "risk", "reason", "status", "age", "sort"],
    "/queue/new": ["since", "tenant", "risk", "reason", "status", "age", "q"],
    "/metrics/": ["window", "tenant"],
    "/approvals/": ["tenant", "cursor"],
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
