"""Fixtures for the agent API tests: keyed clients for Acme and for the Globex outsider."""

from __future__ import annotations

import pytest

from tests.support.api import Api


@pytest.fixture
def api(agent_key) -> Api:
    """The onboarding agent (Acme, agent scope)."""
    return Api(agent_key[1])


@pytest.fixture
def outsider_api(outsider_key) -> Api:
    """Globex's key: valid, but every Acme object must look nonexistent to it."""
    return Api(outsider_key[1])
