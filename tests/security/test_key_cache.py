"""API keys are looked up once per ``SAGA_KEY_CACHE_S`` per web process, not on every request, and
a revoked key stops working within that bound: at once in the process that revoked it, within the
bound in every other one (here: ``manage.py revoke_agent_key`` in a process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from infra.conf import saga
from ledger.audit import Actor
from ledger.services.keys import agent_key_create, agent_key_revoke, key_cache_clear
from tests.support.processes import ROOT, database_url_for_subprocesses

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _empty_cache():
    key_cache_clear()
    yield
    key_cache_clear()


def _get(client: Client, secret: str) -> int:
    return client.get("/api/v1/policies", headers={"Authorization": f"Bearer {secret}"}).status_code


def _revoke_in_another_process(prefix: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocesses()}
    subprocess.run(
        [sys.executable, "manage.py", "revoke_agent_key", "--prefix", prefix],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )


def test_the_documented_bound_is_five_seconds():
    assert saga().key_cache_s == 5.0


def test_it_looks_a_key_up_once_and_then_answers_from_memory(tenant, agent_key):
    _, secret = agent_key
    client = Client()
    assert _get(client, secret) == 200
    with CaptureQueriesContext(connection) as queries:
        assert _get(client, secret) == 200
    assert not [q for q in queries.captured_queries if "ledger_agentkey" in q["sql"]]


def test_a_key_revoked_in_another_process_stops_within_the_bound(tenant, settings):
    settings.SAGA = {**settings.SAGA, "KEY_CACHE_S": 2.0}
    issued = agent_key_create(
        tenant=tenant, name="onboarding-agent", scopes=["agent"], actor=Actor.system("t")
    )
    client = Client()
    assert _get(client, issued.secret) == 200

    _revoke_in_another_process(issued.key.prefix)
    revoked_at = time.monotonic()
    # Inside the bound this process may still trust it (that is what the bound allows) …
    statuses = []
    while time.monotonic() - revoked_at < 2.0 + 1.0:
        statuses.append((time.monotonic() - revoked_at, _get(client, issued.secret)))
        if statuses[-1][1] == 401:
            break
        time.sleep(0.1)
    # … and past it, never: the first 401 came within the bound (plus the time one request takes).
    first_refusal = next((elapsed for elapsed, status in statuses if status == 401), None)
    assert first_refusal is not None, statuses
    assert first_refusal <= 2.0 + 0.5, statuses
    assert _get(client, issued.secret) == 401


def test_a_key_revoked_in_this_process_stops_at_once(tenant, agent_key):
    key, secret = agent_key
    client = Client()
    assert _get(client, secret) == 200
    agent_key_revoke(key=key, actor=Actor.system("tests"))
    assert _get(client, secret) == 401


def test_a_cached_key_does_not_vouch_for_another_secret_with_its_prefix(tenant, agent_key):
    _, secret = agent_key
    client = Client()
    assert _get(client, secret) == 200
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    assert _get(client, forged) == 401


def test_the_cache_can_be_turned_off(tenant, settings):
    settings.SAGA = {**settings.SAGA, "KEY_CACHE_S": 0}
    issued = agent_key_create(
        tenant=tenant, name="onboarding-agent", scopes=["agent"], actor=Actor.system("t")
    )
    client = Client()
    assert _get(client, issued.secret) == 200
    _revoke_in_another_process(issued.key.prefix)
    assert _get(client, issued.secret) == 401


def test_a_request_changing_its_key_object_does_not_change_the_next_requests(tenant, agent_key):
    """Each request gets its own copy of the cached key and tenant."""
    from ledger.services.keys import agent_key_authenticate

    _, secret = agent_key
    first = agent_key_authenticate(raw_key=secret)
    assert first is not None
    first.name = "tampered"
    first.tenant.slug = "tampered"
    second = agent_key_authenticate(raw_key=secret)
    assert second is not None
    assert (second.name, second.tenant.slug) == ("onboarding-agent", "acme")
