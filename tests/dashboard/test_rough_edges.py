"""The rough edges a new user noticed: one way to say a duration, "just now",
state names read as sentences, "could not be undone" only once someone decided, no bulk bar with
nothing to tick, no gap after "Approvals" in the nav, and one rule for the suggested decision."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from dashboard.presenters.charts import bar_chart
from dashboard.templatetags.dashboard import ago, duration
from infra.durations import ago_words, duration_short, duration_words
from ledger.audit import Actor
from ledger.models import Run
from ledger.services import runs
from ledger.transitions import run_state_phrase
from recovery import decisions
from recovery.actions.resolutions import item_close
from recovery.models import RecoveryItem
from recovery.trail import run_trail
from recovery.transitions import items
from tests.factories import onboarding_run, perform_action

ROOT = Path(__file__).resolve().parents[2]


# --- One humaniser --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "short"),
    [(0.4, "0.4s"), (45, "45s"), (59.9, "59.9s"), (84, "1m 24s"), (3600, "1h 0m"), (93784, "1d 2h")],
)
def test_a_duration_reads_the_same_on_the_card_and_on_the_chart(seconds, short):
    # The approval-wait p95 of 84 s read "1m" on its card and "1.4m" on the chart.
    chart = bar_chart([("Approval wait p95", seconds)], unit="s")
    assert duration(seconds) == chart.bars[0].display == duration_short(seconds) == short


def test_the_insights_page_prints_the_approval_wait_as_its_chart_does(client, alice, monkeypatch):
    from dashboard.selectors import insights as insights_selectors

    real = insights_selectors.insights

    def with_a_slow_approval(**kwargs):
        data = real(**kwargs)
        object.__setattr__(data, "approval_p95_s", 84.0)
        return data

    monkeypatch.setattr(insights_selectors, "insights", with_a_slow_approval)
    client.force_login(alice)
    body = client.get(reverse("dashboard:insights")).content.decode()
    card = re.search(r"Approval wait p50 / p95</span><span class=\"kpi-value\">[^<]*</span>", body)
    assert card is not None and card.group(0).endswith("/ 1m 24s</span>")
    assert "1m 24s" in body.split('id="chart-latency-desc"')[1] and "1.4m" not in body


def test_under_a_minute_ago_is_just_now_never_zero_minutes():
    now = timezone.now()
    assert ago(now) == ago(now - timedelta(seconds=59)) == ago_words(0) == "just now"
    assert ago(now - timedelta(minutes=6, seconds=5)) == "6 minutes ago"
    assert ago((now - timedelta(hours=2, minutes=5)).isoformat()) == "2 hours 5 minutes ago"
    assert ago(30) == "just now" and ago(None) == "—"
    assert duration_words(1) == "1 second" and duration_words(90061) == "1 day 1 hour"


def test_no_template_says_how_long_ago_with_djangos_timesince():
    # timesince says "0 minutes" for a moment ago: every "ago" goes through the one humaniser.
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("dashboard/templates", "demo/templates")
        for path in (ROOT / folder).rglob("*.html")
        if re.search(r"\|\s*timesince\b[^%}]*}}\s*ago", path.read_text())
    ]
    assert offenders == []


# --- State names in sentences ---------------------------------------------------------------


@pytest.mark.parametrize("status", Run.Status.values)
def test_a_runs_state_reads_as_a_sentence(status):
    phrase = run_state_phrase(status)
    assert f"is {status}" not in f"the run {phrase}" or status == Run.Status.RUNNING


@pytest.mark.django_db
def test_the_trail_says_the_run_succeeded_not_is_succeeded(tenant, agent):
    run = runs.run_create(tenant=tenant, actor=agent, agent="onboarding", request="Onboard Ashu")
    runs.run_complete(run=run, actor=agent, summary="done")
    summary = run_trail(run=Run.objects.get(pk=run.pk))["summary"]
    assert "and the run succeeded." in summary and "is succeeded" not in summary
    refusal = decisions.transition_sentence("Run", Run.Status.SUCCEEDED, Run.Status.CLOSED)
    assert refusal == "The run succeeded; it cannot be closed."
    cancelled = decisions.transition_sentence("Run", Run.Status.COMPENSATED, Run.Status.CANCELLED)
    assert cancelled == "Only a running or failed run can be cancelled; this one was compensated."


# --- "What could not be undone" ------------------------------------------------------------


@pytest.mark.django_db
def test_nothing_is_said_not_undone_before_anyone_decided(client, tenant, agent, alice):
    run, item = onboarding_run(tenant, agent)
    trail = run_trail(run=run)
    assert trail["not_undone"] == [] and len(trail["changed"]) == 2
    assert "Nobody has decided yet whether to undo what it changed." in trail["summary"]
    client.force_login(alice)
    page = client.get(reverse("dashboard:run-trail", args=[run.pk])).content.decode()
    assert "What could not be undone" not in page

    # Alice closes it as it stands: now what stays in effect was not undone, and says why.
    item_close(item=item, actor=Actor.for_user(alice), reason="fixed by hand")
    trail = run_trail(run=Run.objects.get(pk=run.pk))
    assert {e["reason"] for e in trail["not_undone"]} == {"the run was closed without undoing it"}
    assert "Nobody has decided" not in trail["summary"]
    page = client.get(reverse("dashboard:run-trail", args=[run.pk])).content.decode()
    assert "What could not be undone" in page


# --- The queue ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_bulk_bar_is_not_shown_with_nothing_to_tick(client, tenant, agent, alice, carol):
    client.force_login(alice)
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert "Nothing needs a decision" in body and "bulk-bar" not in body
    onboarding_run(tenant, agent)  # one item, but not low risk: nothing to tick either
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert "bulk-check" not in body and "bulk-bar" not in body
    RecoveryItem.objects.update(risk="low")
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert "bulk-check" in body and "bulk-bar" in body
    # Carol only looks: no box to tick, no bar.
    client.force_login(carol)
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert "bulk-check" not in body and "bulk-bar" not in body


@pytest.mark.django_db
def test_the_nav_has_no_gap_after_approvals_without_a_badge(client, alice):
    client.force_login(alice)
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert re.search(r">Approvals<span id=\"nav-approvals-badge\"></span>\s*</a>", body)
    css = (ROOT / "dashboard/static/css/app.css").read_text()
    assert "#nav-approvals-badge:empty { display: none; }" in css


# --- One rule for the suggestion ------------------------------------------------------------


@pytest.mark.django_db
def test_an_ended_gateway_session_is_suggested_for_compensation_not_a_resume(tenant, agent):
    from tests.factories import load_onboarding_policies

    load_onboarding_policies()
    suggestions = {}
    for metadata in ({}, {"gateway": "saga-mcp", "mcp_client": "an MCP client"}):
        run = runs.run_create(
            tenant=tenant, actor=agent, agent="mcp-agent", request="MCP session", metadata=metadata
        )
        perform_action(run, agent, "hr.create_user", target_id="sofia", args={"email": "s@x.example"})
        failed = perform_action(
            run, agent, "email.send_welcome", target_id="sofia", args={"to": "s@@x"}, fail="refused"
        )
        suggestions[bool(metadata)] = items.suggest_resolution(run=run, failed_action=failed)
    assert suggestions == {False: RecoveryItem.Suggestion.RESUME, True: RecoveryItem.Suggestion.COMPENSATE}
