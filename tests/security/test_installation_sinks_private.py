"""The installation's SIEM sink is the operator's: its URL (a SIEM's address,
perhaps with a token in its query) and its last error (what the SIEM answered) are shown on the
audit stream page to installation admins (superusers) only — never to each tenant's operators and
admins, who still see how far behind their own events are, and everything about their own sinks."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from ledger.audit import Actor, audit_record
from ledger.models import Event, Membership, Tenant
from recovery.audit_stream.models import AuditCursor, AuditSink

pytestmark = pytest.mark.django_db

PAGE = "/audit-stream/"
SIEM_URL = "tcp+tls://siem-4471.corp.example:6514"
SIEM_ERROR = "ssl.SSLCertVerificationError: certificate verify failed for siem-4471.corp.example"


@pytest.fixture
def failing_siem(settings: Any, tenant: Tenant) -> None:
    settings.AUDIT_STREAM = {"SYSLOG_URL": SIEM_URL, "KEY": ""}
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1:6514"]}
    audit_record(tenant=tenant, actor=Actor.system("t"), kind="test.event", subject="t:1")
    AuditCursor.objects.create(sink="syslog", tenant=tenant, last_error=SIEM_ERROR)


def test_a_tenants_operator_and_admin_never_see_the_installations_sink_url_or_error(
    client: Any, tenant: Tenant, alice: Any, dave: Any, failing_siem: None
) -> None:
    own = AuditSink.objects.create(tenant=tenant, kind="syslog", url="tcp://127.0.0.1:6514", enabled=True)
    AuditCursor.objects.create(sink=f"tenant:{own.pk}", tenant=tenant, last_error="own sink refused")
    for person in (alice, dave):  # an operator, and the tenant's admin
        client.force_login(person)
        page = client.get(PAGE).content.decode()
        assert 'data-sink="syslog"' in page  # the row is there, with its lag ...
        assert f'data-behind="{Event.objects.filter(tenant=tenant).count()}"' in page
        # ... but not where it sends to, nor what it answered, nor the installation's settings.
        assert "siem-4471" not in page and "SSLCertVerificationError" not in page
        assert "data-problem" not in page
        assert "own sink refused" in page and "127.0.0.1:6514" in page  # their own sink: all of it


def test_a_superuser_sees_the_installations_sink_url_and_error(
    client: Any, tenant: Tenant, failing_siem: None
) -> None:
    root = get_user_model().objects.create_superuser("root", password="correct-horse-battery")
    Membership.objects.create(user=root, tenant=tenant, role="operator")
    client.force_login(root)
    page = client.get(PAGE).content.decode()
    assert "siem-4471.corp.example" in page and "SSLCertVerificationError" in page
    assert "data-problem" in page and "SAGA_AUDIT_KEY" in page  # the missing key, said on the page
