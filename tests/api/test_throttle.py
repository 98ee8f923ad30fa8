from __future__ import annotations

import pytest

from saga_admin.limits import parse_rate
from tests.api.helpers import error_of

pytestmark = pytest.mark.django_db


def test_a_key_over_its_rate_gets_429_with_retry_after(api, outsider_api, settings):
    # A daily window: the test cannot straddle a window boundary in practice.
    settings.SAGA = {**settings.SAGA, "THROTTLE_RATE": "3/d"}
    assert [api.get("/runs").status_code for _ in range(3)] == [200, 200, 200]
    response = api.get("/runs")
    assert response.status_code == 429
    assert error_of(response)["code"] == "rate_limited"
    assert int(response["Retry-After"]) >= 1
    # The limit is per key: another key is unaffected.
    assert outsider_api.get("/runs").status_code == 200


@pytest.mark.parametrize(
    "rate, expected",
    [("6000/m", (6000, 60)), ("10/5s", (10, 5)), ("1/h", (1, 3600)), ("100/day", (100, 86400))],
)
def test_rates_parse(rate, expected):
    assert parse_rate(rate) == expected
