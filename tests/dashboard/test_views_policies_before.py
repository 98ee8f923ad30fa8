"""The policies page shows each policy's before read (tool, args, path) and the scope's readers: the
kind for everyone, where a reader points only for those who see where compensators point, a
webhook's secret never; and the before-image warnings the loader prints."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.factories import load_policy_file

pytestmark = pytest.mark.django_db

SECRET = "reader-secret-0123456789"
FILE = {
    "policies": [
        {"tool": "crm.get_contact", "risk": "low", "approval": "auto", "action_class": "read_only"},
        {
            "tool": "crm.update_contact",
            "risk": "medium",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
            "before": {"tool": "crm.get_contact", "args": {"id": "$args.id"}, "path": "contact"},
            "compensation_tool": "crm.update_contact",
            "compensation_args": {"id": "$args.id", "email": "$before.email"},
        },
        {"tool": "inv.get_item", "risk": "low", "approval": "auto", "action_class": "read_only"},
        {
            "tool": "inv.set_price",
            "risk": "low",
            "approval": "auto",
            "action_class": "internal_update",
            "compensation": "custom",
            "before": {"tool": "inv.get_item"},
            "compensation_tool": "inv.set_price",
            "compensation_args": {"price": "$before.price"},
        },
    ],
    "readers": {
        "crm.get_contact": {"webhook": "https://crm.example.com/saga/read", "secret": SECRET},
    },
}


def _page(client, user):
    client.force_login(user)
    response = client.get(reverse("dashboard:policies"))
    assert response.status_code == 200
    return response.content.decode()


def test_an_operator_sees_the_before_read_and_where_the_reader_points(client, tenant, alice):
    load_policy_file(FILE, tenant=tenant)
    body = _page(client, alice)
    before = re.search(r'<p class="small policy-before" data-before="crm.get_contact">(.*?)</p>', body, re.S)
    assert before is not None
    assert "<code>crm.get_contact</code>" in before[1]
    assert "{&quot;id&quot;: &quot;$args.id&quot;}" in before[1] and "<code>contact</code>" in before[1]
    # No args and no path: said as such.
    whole = re.search(r'data-before="inv.get_item">(.*?)</p>', body, re.S)
    assert whole is not None and "the whole result" in whole[1] and " with " not in whole[1]
    reader = re.search(r'<tr data-reader="crm.get_contact">(.*?)</tr>', body, re.S)
    assert reader is not None
    assert "HTTP webhook" in reader[1] and "https://crm.example.com/saga/read" in reader[1]
    assert "tenant" in reader[1] and "tests.json" in reader[1]
    assert SECRET not in body


def test_a_viewer_sees_the_readers_kind_not_where_it_points(client, tenant, carol):
    load_policy_file(FILE, tenant=tenant)
    body = _page(client, carol)
    reader = re.search(r'<tr data-reader="crm.get_contact">(.*?)</tr>', body, re.S)
    assert reader is not None and "HTTP webhook" in reader[1]
    assert "crm.example.com" not in body and SECRET not in body
    assert "Where each reader points is shown to operators and admins" in body


def test_the_before_warnings_are_shown(client, tenant, carol):
    load_policy_file(FILE, tenant=tenant)
    body = _page(client, carol)
    warnings = re.findall(r'<li data-before-warning="([a-z_]+)" data-policy="([^"]+)">(.*?)</li>', body, re.S)
    assert [(code, policy) for code, policy, _ in warnings] == [("reader_missing", "inv.set_price")]
    assert "inv.get_item has no reader" in warnings[0][2]


def test_a_tenant_without_before_reads_shows_no_readers_section(client, tenant, carol):
    load_policy_file({"policies": FILE["policies"][:1]}, tenant=tenant)
    body = _page(client, carol)
    assert "<h3>Readers</h3>" not in body and "data-before-warnings" not in body
