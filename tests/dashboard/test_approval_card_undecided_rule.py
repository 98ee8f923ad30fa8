"""An approval that a rule asked for only because of an argument's type says so on its card: the
approver must know the agent sent, say, the amount as text (rules fail closed on types)."""

from __future__ import annotations

import html
import re

import pytest
from django.urls import reverse

from recovery.models import Approval
from tests.factories import charge_policy, load_policy_file, new_run
from tests.support.api import Api

pytestmark = pytest.mark.django_db


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def test_the_card_says_the_rule_applied_because_of_the_values_kind(client, agent_key, bob):
    rules = [{"if": {"arg": "amount", "gt": 1000}, "then": {"risk": "critical", "approval": "manual"}}]
    load_policy_file({"policies": [charge_policy(rules=rules)]})
    api = Api(agent_key[1])
    run = new_run(api)
    for key, amount in (("as-text", "5000"), ("as-number", 5000)):
        recorded = api.post(
            f"/runs/{run['id']}/actions",
            {"tool": "payments.charge", "args": {"amount": amount}, "idempotency_key": key},
        )
        assert recorded.json()["status"] == "awaiting_approval", recorded.content
    as_text, as_number = (
        Approval.objects.get(action__idempotency_key=key) for key in ("as-text", "as-number")
    )
    client.force_login(bob)
    body = client.get(reverse("dashboard:approvals")).content.decode()
    cards = {
        approval.pk: _text(
            re.search(rf'<article [^>]*id="approval-{approval.pk}".*?</article>', body, re.S).group(0)
        )
        for approval in (as_text, as_number)
    }
    assert (
        "Rule 0: amount > 1,000 → critical, manual approval (applied because the value at amount is "
        "not of the kind the rule compares)" in cards[as_text.pk]
    )
    assert "Rule 0: amount > 1,000 → critical, manual approval" in cards[as_number.pk]
    assert "applied because" not in cards[as_number.pk]


def test_the_run_page_says_so_too(client, agent_key, alice):
    rules = [
        {"if": {"arg": "amount", "gt": 1000}, "then": {"approval": "manual"}},
        {"if": {"arg": "vip", "eq": True}, "then": {"risk": "high"}},
    ]
    load_policy_file({"policies": [charge_policy(rules=rules)]})
    api = Api(agent_key[1])
    run = new_run(api)
    recorded = api.post(
        f"/runs/{run['id']}/actions",
        {"tool": "payments.charge", "args": {"amount": ["5000"], "vip": True}, "idempotency_key": "k"},
    )
    assert recorded.json()["policy"]["rule"]["also"][0]["index"] == 1, recorded.content
    client.force_login(alice)
    body = client.get(reverse("dashboard:run-detail", args=[run["id"]])).content.decode()
    found = re.search(r"<dd data-rule>(.*?)</dd>", body, re.S)
    assert found is not None
    assert _text(found.group(1)) == (
        "Rule 0: amount > 1,000 → manual approval (applied because the value at amount is not of the "
        "kind the rule compares); Rule 1: vip = true → high"
    )
