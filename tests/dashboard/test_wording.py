"""Small things a newcomer read wrong."""

from __future__ import annotations

import pytest

from dashboard.templatetags.dashboard import risk_badge
from demo.templatetags.demo_money import cents


@pytest.mark.parametrize(("risk", "filled"), [("low", 1), ("medium", 2), ("high", 3), ("critical", 4)])
def test_the_risk_badge_is_a_meter_and_a_word_never_a_glyph_that_reads_as_a_character(risk, filled):
    html = str(risk_badge(risk))
    assert html.count('<i class="on"></i>') == filled and html.count("<i") == 4
    assert risk.capitalize() in html
    assert not any(glyph in html for glyph in "▁▃▆█_")


def test_money_reads_as_money():
    assert cents(1400) == "$14.00"
    assert cents(4820000, "USD") == "$48,200.00"
    assert cents(999, "eur") == "€9.99"
    assert cents(1234, "chf") == "12.34 CHF"
    assert cents(None) == "—"


@pytest.mark.django_db
def test_an_action_with_no_compensating_tool_says_it_cannot_be_undone(client, tenant, agent, carol):
    from django.urls import reverse

    from ledger.services import runs
    from tests.factories import record

    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="x")
    record(run, agent, "k1", tool="crm.note")
    client.force_login(carol)
    body = client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()
    assert "Registered compensating tool" not in body
    assert "Cannot be undone" in body


@pytest.mark.django_db
def test_a_resume_without_any_checkpoint_says_so_once_and_offers_no_checkpoint_to_pick(
    client, tenant, agent, alice
):
    from django.urls import reverse

    from ledger.services import runs
    from recovery.actions.reports import run_fail_and_queue
    from tests.factories import load_onboarding_policies, perform_action

    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="x")
    perform_action(
        run, agent, "hr.create_user", target_id="ashu@company.com", args={"email": "ashu@company.com"}
    )
    item = run_fail_and_queue(run=run, actor=agent, error="boom").item
    client.force_login(alice)
    body = client.get(reverse("dashboard:item-resume", args=[item.pk])).content.decode()
    assert body.count("No checkpoint") == 1 and "Stale checkpoint" not in body
    assert "repeating the 1 action(s) that already succeeded: hr.create_user" in body
    assert 'name="checkpoint"' not in body and "Latest checkpoint" not in body
