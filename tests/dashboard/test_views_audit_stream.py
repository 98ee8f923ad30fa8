"""The Audit stream page: every sink with its lag and last error for operators and admins; a
tenant admin sets the tenant's own sink, whose hostile URL is refused as a form error (the
dashboard's and the Django admin's); nobody reaches another tenant's sinks."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.audit import Actor, audit_record
from ledger.models import Event, Tenant
from ledger.staff import membership_set
from recovery.audit_stream.models import AuditCursor, AuditSink

pytestmark = pytest.mark.django_db

PAGE = "/audit-stream/"
SET = "/audit-stream/acme/sinks"


@pytest.fixture
def allowed(settings: Any) -> None:
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": ["127.0.0.1:6514"]}


def test_who_sees_what(client: Any, alice: Any, bob: Any, carol: Any, dave: Any) -> None:
    client.force_login(carol)  # viewer
    assert client.get(PAGE).status_code == 403
    client.force_login(bob)  # approver
    assert client.get(PAGE).status_code == 403
    client.force_login(alice)  # operator: the sinks and their lag, no settings
    page = client.get(PAGE)
    assert page.status_code == 200 and "Save sink" not in page.content.decode()
    assert client.post(SET, {"kind": "syslog", "url": "tcp://127.0.0.1:6514"}).status_code == 403
    client.force_login(dave)  # admin
    assert "Save sink" in client.get(PAGE).content.decode()


def test_an_admin_sets_a_sink_and_sees_its_lag(client: Any, tenant: Tenant, dave: Any, allowed: None) -> None:
    with_token = {
        "kind": "hec",
        "url": "https://127.0.0.1:6514/services/collector/event",
        "token": "s3cret-token",
    }
    client.force_login(dave)
    response = client.post(SET, {**with_token, "enabled": "on"})
    assert response.status_code == 303
    sink = AuditSink.objects.get(tenant=tenant)
    assert (sink.kind, sink.token, sink.enabled) == ("hec", "s3cret-token", True)
    assert Event.objects.filter(tenant=tenant, kind="audit_stream.sink_set").exists()
    page = client.get(PAGE).content.decode()
    assert f'data-sink="tenant:{sink.pk}"' in page and "s3cret-token" not in page
    behind = Event.objects.filter(tenant=tenant).count()
    assert f'data-behind="{behind}"' in page
    # A blank token keeps the current one.
    client.post(SET, {**with_token, "token": ""})
    assert AuditSink.objects.get(pk=sink.pk).token == "s3cret-token"
    assert client.post(SET, {"remove": "hec"}).status_code == 303
    assert not AuditSink.objects.exists()


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"kind": "syslog", "url": "tcp://127.0.0.1:514"}, "not allowed"),
        ({"kind": "syslog", "url": "tcp://169.254.169.254:514"}, "not allowed"),
        ({"kind": "syslog", "url": "https://203.0.113.9/"}, "must be a tcp:// or tcp+tls:// URL"),
        ({"kind": "hec", "url": "https://192.168.1.10/", "token": "t"}, "not allowed"),
        ({"kind": "hec", "url": "https://203.0.113.9/" + "x" * 600, "token": "t"}, "at most 500 characters"),
        ({"kind": "kafka", "url": "https://203.0.113.9/"}, "Select a valid choice"),
    ],
)
def test_a_hostile_sink_is_a_form_error(
    client: Any, tenant: Tenant, dave: Any, fields: dict, says: str
) -> None:
    client.force_login(dave)
    response = client.post(SET, fields)
    assert response.status_code == 422 and says in response.content.decode()
    assert not AuditSink.objects.exists()


def test_another_tenants_sinks_are_not_found(client: Any, tenant: Tenant, mallory: Any) -> None:
    client.force_login(mallory)
    assert client.post(SET, {"kind": "syslog", "url": "tcp://203.0.113.9:514"}).status_code == 404


def test_an_installation_sinks_error_and_lag_are_shown(
    client: Any, settings: Any, tenant: Tenant, alice: Any
) -> None:
    settings.AUDIT_STREAM = {"SYSLOG_URL": "tcp+tls://siem.example:6514", "KEY": ""}
    audit_record(tenant=tenant, actor=Actor.system("t"), kind="test.event", subject="t:1")
    AuditCursor.objects.create(sink="syslog", tenant=tenant, last_error="ConnectionRefusedError: refused")
    # The installation's sink's error is for installation admins.
    alice.is_superuser = True
    alice.save(update_fields=["is_superuser"])
    client.force_login(alice)
    page = client.get(PAGE).content.decode()
    assert 'data-sink="syslog"' in page and "ConnectionRefusedError: refused" in page
    assert f'data-behind="{Event.objects.filter(tenant=tenant).count()}"' in page
    assert "SAGA_AUDIT_KEY" in page  # the missing key, said on the page


def test_the_django_admin_checks_the_same(client: Any, tenant: Tenant, dave: Any, allowed: None) -> None:
    membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))
    client.force_login(dave)
    refused = client.post(
        "/admin/audit_stream/auditsink/add/",
        {"tenant": tenant.pk, "kind": "syslog", "url": "tcp://10.1.2.3:514", "enabled": "on"},
    )
    assert refused.status_code == 200 and "not allowed" in refused.content.decode()
    assert not AuditSink.objects.exists()
    ok = client.post(
        "/admin/audit_stream/auditsink/add/",
        {"tenant": tenant.pk, "kind": "syslog", "url": "tcp+tls://127.0.0.1:6514", "enabled": "on"},
    )
    assert ok.status_code == 302, ok.content.decode()[:2000]
    assert AuditSink.objects.get().url == "tcp+tls://127.0.0.1:6514"
    assert Event.objects.filter(tenant=tenant, kind="audit_stream.sink_set").exists()
