"""API responses are rendered by orjson with the standard encoder's exact output, and fall back to
it for what orjson refuses, so no value an agent stored can turn a read into a 500."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid

import pytest
from ninja.renderers import JSONRenderer

from saga_admin.api.renderers import ORJSONRenderer
from tests.factories import new_action, new_run

pytestmark = pytest.mark.django_db


def test_it_renders_what_the_standard_renderer_renders():
    data = {
        "at": datetime.datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.UTC),
        "day": datetime.date(2026, 1, 1),
        "amount": decimal.Decimal("1.50"),
        "id": uuid.UUID("59e7340a-da61-4088-96fb-ea609ee2d982"),
        "mixed": [1, 2.5, None, True, "é\u2028", {"nested": [[]]}],
        "big": 2**63,
    }
    ours = ORJSONRenderer().render(None, data, response_status=200)
    theirs = JSONRenderer().render(None, data, response_status=200)
    assert json.loads(ours) == json.loads(theirs)
    assert b'"2026-01-02T03:04:05.123Z"' in ours


def test_an_integer_beyond_64_bits_in_an_agents_args_reads_back_exactly(api):
    huge = 2**200
    run = new_run(api)
    action = new_action(api, run["id"], args={"amount": huge, "items": [-(2**90)]}, compensation=None)
    response = api.get(f"/actions/{action['id']}")
    assert response.status_code == 200
    assert response.json()["args"] == {"amount": huge, "items": [-(2**90)]}
