"""The TypeScript client's suite (clients/typescript) against a live server: the server under
pytest-django's live_server, a real ``saga_worker`` process on the throwaway Redis, and the
onboarding scenario's compensating services (signed webhooks)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.factories import HR_PATH, HR_SECRET, WS_PATH, WS_SECRET
from tests.support.processes import WebhookServer, serve_webhooks
from tests.support.typescript import Npm


@pytest.fixture(autouse=True)
def _every_test_on_the_throwaway_redis(own_redis):
    return own_redis


@pytest.fixture
def webhooks() -> Iterator[WebhookServer]:
    with serve_webhooks({HR_PATH: HR_SECRET, WS_PATH: WS_SECRET}) as server:
        yield server


@pytest.fixture(scope="session")
def npm() -> Npm:
    """clients/typescript with its locked dependencies installed (``npm ci``, once per lockfile)."""
    tool = Npm()
    tool.install()
    return tool
