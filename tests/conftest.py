"""Shared personas and fixtures. Tests run against the machine's real PostgreSQL and Redis."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_configure(config: pytest.Config) -> None:
    # The live server's listen backlog is Django's 10; tests that race 24 connections at it (the
    # idempotency races) then lose one to "connection reset by peer" whenever the machine is busy.
    # Deep enough for every race in the suite; set before the session-wide live server starts.
    from django.core.servers.basehttp import WSGIServer

    WSGIServer.request_queue_size = 64


@pytest.fixture
def tenant(db):
    from ledger.models import Tenant

    return Tenant.objects.create(slug="acme", name="Acme Corp")


@pytest.fixture
def other_tenant(db):
    from ledger.models import Tenant

    return Tenant.objects.create(slug="globex", name="Globex (another tenant)")


@pytest.fixture
def agent_key(tenant):
    """The onboarding agent's key: (AgentKey, raw secret)."""
    from ledger.audit import Actor
    from ledger.services import agent_key_create

    issued = agent_key_create(
        tenant=tenant, name="onboarding-agent", scopes=["agent"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


@pytest.fixture
def operator_key(tenant):
    from ledger.audit import Actor
    from ledger.services import agent_key_create

    issued = agent_key_create(
        tenant=tenant, name="supervisor", scopes=["agent", "operator"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


@pytest.fixture
def outsider_key(other_tenant):
    from ledger.audit import Actor
    from ledger.services import agent_key_create

    issued = agent_key_create(
        tenant=other_tenant, name="globex-agent", scopes=["agent", "operator"], actor=Actor.system("tests")
    )
    return issued.key, issued.secret


@pytest.fixture
def agent(agent_key):
    from ledger.audit import Actor

    return Actor.for_key(agent_key[0])


def _user(username: str, tenant, role: str):
    from django.contrib.auth import get_user_model

    from ledger.models import Membership

    user = get_user_model().objects.create_user(username=username, password="correct-horse-battery")
    if tenant is not None:
        Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


@pytest.fixture
def alice(tenant):
    """Alice is an operator at Acme."""
    return _user("alice", tenant, "operator")


@pytest.fixture
def bob(tenant):
    """Bob approves risky actions at Acme."""
    return _user("bob", tenant, "approver")


@pytest.fixture
def carol(tenant):
    """Carol can only look (viewer at Acme)."""
    return _user("carol", tenant, "viewer")


@pytest.fixture
def dave(tenant):
    """Dave is an Acme admin."""
    return _user("dave", tenant, "admin")


@pytest.fixture
def mallory(other_tenant):
    """Mallory is an operator at Globex, an outsider to Acme."""
    return _user("mallory", other_tenant, "operator")
