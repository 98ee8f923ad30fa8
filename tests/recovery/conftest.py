"""The recovery engine's tests all run on the throwaway Redis (so a test may stop it); the
compensating service they call checks signatures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.factories import HR_PATH, HR_SECRET, WS_PATH, WS_SECRET
from tests.support.processes import WebhookServer, serve_webhooks
from tests.support.s3 import s3, s3_server  # noqa: F401 - the retention tests' S3 API (moto_server)


@pytest.fixture(autouse=True)
def _every_test_on_the_throwaway_redis(own_redis):
    return own_redis


@pytest.fixture
def webhooks() -> Iterator[WebhookServer]:
    """The HR and workspace services' compensation endpoints (``load_onboarding_policies``
    registers them given this server)."""
    with serve_webhooks({HR_PATH: HR_SECRET, WS_PATH: WS_SECRET}) as server:
        yield server
