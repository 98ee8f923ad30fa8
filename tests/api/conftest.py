"""Fixtures for the agent API tests: keyed clients for Acme and for the Globex outsider."""

from __future__ import annotations

import pytest

from tests.api.helpers import Api


@pytest.fixture
def api(agent_key) -> Api:
    """The onboarding agent (Acme, agent scope)."""
    return Api(agent_key[1])


@pytest.fixture
def outsider_api(outsider_key) -> Api:
    """Globex's key: valid, but every Acme object must look nonexistent to it."""
    return Api(outsider_key[1])


@pytest.fixture
def onboarding_policies(db):
    """Global policies for the onboarding scenario: the first two steps run without approval; the
    welcome e-mail is irreversible (a correction can follow it) but auto-approved."""
    from ledger.models import ToolPolicy

    rows = [
        ("hr.create_user", "medium", "auto", "external_reversible", "custom"),
        ("workspace.provision_license", "medium", "auto", "external_reversible", "custom"),
        ("email.send_welcome", "high", "auto", "external_irreversible", "correction"),
        ("payments.charge", "critical", "manual", "external_irreversible", "correction"),
        ("crm.update_*", "low", "auto", "internal_update", "snapshot"),
    ]
    return [ToolPolicy.objects.create(tool=tool, risk=risk, approval=approval, action_class=cls, compensation=comp,
                                      source="tests")
            for tool, risk, approval, cls, comp in rows]

