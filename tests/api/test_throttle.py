from __future__ import annotations

import math
import time

import pytest

from infra.throttle import parse_rate
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db

DAY_S = 86400


def test_a_key_over_its_rate_gets_429_with_retry_after(api, outsider_api, settings):
    # A daily window: the test cannot straddle a window boundary in practice.
    settings.SAGA = {**settings.SAGA, "THROTTLE_RATE": "3/d"}
    assert [api.get("/runs").status_code for _ in range(3)] == [200, 200, 200]
    before = time.time()
    response = api.get("/runs")
    after = time.time()
    assert response.status_code == 429
    assert error_of(response)["code"] == "rate_limited"
    # Retry when the day's window ends: the seconds left in it, rounded up, as of the request.
    window_end = (before // DAY_S + 1) * DAY_S
    assert math.ceil(window_end - after) <= int(response["Retry-After"]) <= math.ceil(window_end - before)
    # The limit is per key: another key is unaffected.
    assert outsider_api.get("/runs").status_code == 200


@pytest.mark.parametrize(
    "rate, expected",
    [("6000/m", (6000, 60)), ("10/5s", (10, 5)), ("1/h", (1, 3600)), ("100/day", (100, 86400))],
)
def test_rates_parse(rate, expected):
    assert parse_rate(rate) == expected


def test_with_the_cache_down_a_refusal_is_still_401_and_a_key_is_still_served(api, settings):
    """Both counters fail open: a rate limit must not take the API down (nor turn a 401 into a
    500) when Redis is unreachable."""
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens on port 1
        }
    }
    settings.SAGA = {**settings.SAGA, "THROTTLE_RATE": "1/d", "UNAUTHENTICATED_RATE": "1/d"}
    for _ in range(2):
        response = Api(None).get("/runs")
        assert response.status_code == 401 and error_of(response)["code"] == "unauthorized"
        assert api.get("/runs").status_code == 200
