"""The policies page explains "Check" to whoever can press it (a tenant admin), and tells everyone
else who checks compensators instead of describing a button they do not have."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.factories import load_policy_file

pytestmark = pytest.mark.django_db

FILE = {
    "policies": [
        {"tool": "hr.create_user", "risk": "low", "approval": "auto", "action_class": "internal_update"},
    ],
    "compensators": {"hr.delete_user": {"python": "demo.compensators.delete_user"}},
}


def _help(client) -> tuple[str, bool]:
    body = client.get(reverse("dashboard:policies")).content.decode()
    (help_text,) = re.findall(r"<p [^>]*data-check-help>(.*?)</p>", body, re.S)
    return help_text, 'data-check="hr.delete_user"' in body


@pytest.mark.parametrize("person", ["alice", "bob", "carol"])
def test_those_who_cannot_check_are_told_who_does(client, tenant, person, request):
    load_policy_file(FILE)
    client.force_login(request.getfixturevalue(person))
    text, button = _help(client)
    assert not button
    assert text.startswith("A tenant admin checks the compensators") and '"Check"' not in text


def test_an_admin_is_told_what_check_sends(client, tenant, dave):
    load_policy_file(FILE)
    client.force_login(dave)
    text, button = _help(client)
    assert button
    assert text.startswith('"Check" sends only calls that cannot undo anything')
