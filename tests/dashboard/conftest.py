from __future__ import annotations

import pytest

from tests.factories import gated_run, onboarding_run


@pytest.fixture
def failed_run(tenant, agent):
    return onboarding_run(tenant, agent)


@pytest.fixture
def approval(tenant, agent):
    return gated_run(tenant, agent)[2]


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    # The personas are created per test; PBKDF2 at full strength would dominate the run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
