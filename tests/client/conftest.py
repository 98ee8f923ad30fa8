"""The Python client against a real server (pytest-django's live_server)."""

from __future__ import annotations

import pytest
from saga_client import Saga


@pytest.fixture
def saga(live_server, agent_key, onboarding_policies):
    client = Saga(live_server.url, agent_key[1], poll_interval_s=0.05, backoff_s=0.01)
    yield client
    client.close()
