"""The policies page names the compensating tools that delete or move money and run unattended: the
same warning ``load_policies`` prints, per tenant as its policies are in
force."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from tests.factories import load_policy_file

pytestmark = pytest.mark.django_db

POLICIES = [
    {
        "tool": "hr.create_user",
        "risk": "low",
        "approval": "auto",
        "action_class": "internal_update",
        "compensation": "custom",
        "compensation_tool": "hr.delete_user",
    },
    {"tool": "hr.delete_user", "risk": "low", "approval": "auto", "action_class": "internal_update"},
]


def _warnings(client) -> str:
    body = client.get(reverse("dashboard:policies")).content.decode()
    found = re.search(r"<div [^>]*data-compensation-warnings.*?</div>", body, re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", found.group(0))).split()) if found else ""


def test_the_policies_page_warns_until_the_compensating_tool_asks_a_person(client, tenant, carol):
    load_policy_file({"policies": POLICIES})
    client.force_login(carol)
    assert _warnings(client) == (
        "Compensations that delete or move money run unattended. Their args come from what agents "
        "report, so an agent could aim one at someone else's account; set approval: manual on their "
        "policies. hr.delete_user (named by hr.create_user) deletes or moves money (its name says "
        "delete); governed by hr.delete_user , approval auto."
    )
    # The tenant asks a person for the step: its page no longer warns.
    load_policy_file(
        {"policies": [{**POLICIES[1], "approval": "manual"}]},
        tenant=tenant,
    )
    assert _warnings(client) == ""
