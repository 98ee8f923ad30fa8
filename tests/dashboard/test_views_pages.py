"""Metrics, policies, login/logout, idle timeout and the security headers every page carries."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from ledger.audit import Actor
from ledger.models import Compensator, ToolPolicy
from recovery.actions.approvals import approval_approve
from recovery.actions.resolutions import item_close
from tests.factories import charge_policy, gated_run, load_policy_file, onboarding_run

pytestmark = pytest.mark.django_db


def test_insights_page_renders_svg_charts(client, tenant, agent, alice, bob):
    run, item = onboarding_run(tenant, agent)
    item_close(item=item, actor=Actor.for_user(alice), reason="done")
    onboarding_run(tenant, agent, name="Open", email="open@company.com")
    client.force_login(bob)
    for window in ("24h", "7d", "30d", "bogus"):
        response = client.get(reverse("dashboard:insights"), {"window": window})
        assert response.status_code == 200
    body = response.content.decode()
    assert "<svg" in body and 'role="img"' in body and "email.send_welcome" in body
    assert "MTTR" in body and "1 resolved" in body
    insights = response.context["m"]
    assert (
        dict(insights.open_by_risk)["Medium"] == 1 and insights.resolved == 1 and insights.mttr_s is not None
    )


def test_insights_are_scoped_to_the_users_tenants(client, tenant, agent, mallory):
    onboarding_run(tenant, agent)
    client.force_login(mallory)
    m = client.get(reverse("dashboard:insights")).context["m"]
    assert sum(n for _label, n in m.open_by_risk) == 0 and not m.top_failing_tools


def test_percentiles_come_from_postgres(tenant, agent, alice, bob):
    from dashboard.selectors import insights as insights_selectors

    for amount in (1, 2, 3):
        approval = gated_run(tenant, agent, amount=amount)[2]
        approval_approve(approval=approval, actor=Actor.for_user(bob), reason="ok")
    m = insights_selectors.insights(user=alice, window="24h")
    assert m.approvals_decided == 3 and m.approval_p50_s is not None and m.approval_p95_s >= m.approval_p50_s


def test_policies_page_lists_policies_and_compensators_with_their_source(client, tenant, agent, alice):
    onboarding_run(tenant, agent)  # loads the test policies
    Compensator.objects.create(
        tool="hr.delete_user",
        kind="webhook",
        url="https://hr.example.com/undo",
        secret_env="HR_SECRET",
        source="policies/acme.json",
    )
    client.force_login(alice)  # an operator: sees where compensators point (a viewer does not)
    body = client.get(reverse("dashboard:policies")).content.decode()
    # One row per policy in force: its tool, scope and source.
    policy_rows = re.findall(
        r'<tr data-policy="[^"]+"><td><code>([^<]+)</code></td>(?:<td>[^<]*</td>){3}<td>.*?</td>\s*'
        r'<td class="small policy-rules">.*?</td>\s*<td>(global|tenant)</td><td class="small">([^<]*)</td></tr>',
        body,
        re.S,
    )
    assert sorted(policy_rows) == sorted(
        (tool, "global", "tests") for tool in ToolPolicy.objects.values_list("tool", flat=True)
    )
    assert "hr.create_user" in body and "crm.update_*" in body
    assert "https://hr.example.com/undo" in body and "policies/acme.json" in body


def test_policies_page_says_rules_and_limits_in_plain_words(client, tenant, carol):
    load_policy_file(
        {
            "policies": [
                charge_policy(
                    approvers=1,
                    rules=[
                        {"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}},
                        {
                            "if": {"arg": "amount", "gt": 10000},
                            "then": {"risk": "critical", "approval": "manual"},
                        },
                    ],
                    limits=[
                        {"window": "1h", "per": "agent", "max_count": 20},
                        {
                            "window": "24h",
                            "per": "tenant",
                            "sum_arg": "amount",
                            "max_sum": 100000,
                            "on_exceed": "deny",
                        },
                    ],
                ),
                charge_policy(tool="payments.refund", approval="manual", approvers=2),
            ]
        }
    )
    client.force_login(carol)
    body = client.get(reverse("dashboard:policies")).content.decode()
    assert "amount &gt; 10,000 → critical, manual approval" in body
    assert "currency is not one of &quot;usd&quot;, &quot;eur&quot; → refused" in body
    assert "At most 20 per agent per hour, then manual approval" in body
    assert "Amount summing to at most 100,000 per tenant per 24 hours, then refused" in body
    assert "Manual approval by 2 people" in body


def test_admin_links_only_for_admins(client, tenant, alice, dave):
    """Pass: the Django admin link for a tenant admin, the RQ dashboard link for superusers only."""
    client.force_login(alice)
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert "/django-rq/" not in body and reverse("admin:index") not in body
    client.force_login(dave)
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert "/django-rq/" not in body and reverse("admin:index") in body
    dave.is_superuser = True
    dave.save(update_fields=["is_superuser"])
    body = client.get(reverse("dashboard:queue")).content.decode()
    assert "/django-rq/" in body and reverse("admin:index") in body


def test_login_rotates_the_session_and_logout_needs_post(client, alice):
    client.get(reverse("login"))
    before = client.cookies.get("sessionid")
    response = client.post(reverse("login"), {"username": "alice", "password": "correct-horse-battery"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.cookies["sessionid"].value != (before.value if before else None)
    assert client.get(reverse("logout")).status_code == 405
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert client.get(reverse("dashboard:queue")).status_code == 302


def test_login_page_has_labelled_fields(client):
    body = client.get(reverse("login")).content.decode()
    assert '<label for="id_username">' in body and '<label for="id_password">' in body
    assert "csrfmiddlewaretoken" in body


def test_repeated_failures_lock_the_account(client, alice, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post(reverse("login"), {"username": "alice", "password": "wrong"})
    response = client.post(reverse("login"), {"username": "alice", "password": "correct-horse-battery"})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session


def test_an_idle_session_is_signed_out(client, alice, settings):
    from dashboard.middleware import SESSION_KEY

    client.force_login(alice)
    assert client.get(reverse("dashboard:queue")).status_code == 200
    session = client.session
    session[SESSION_KEY] = session[SESSION_KEY] - settings.SESSION_IDLE_TIMEOUT_S - 5
    session.save()
    response = client.get(reverse("dashboard:queue"))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_background_polls_do_not_keep_a_session_alive(client, alice):
    from dashboard.middleware import POLL_HEADER, SESSION_KEY

    client.force_login(alice)
    client.get(reverse("dashboard:queue"))
    session = client.session
    session[SESSION_KEY] = session[SESSION_KEY] - 100
    session.save()
    stamp = client.session[SESSION_KEY]
    client.get(reverse("dashboard:queue-new"), headers={POLL_HEADER: "1", "HX-Request": "true"})
    assert client.session[SESSION_KEY] == stamp


def test_what_a_browser_fetches_by_itself_does_not_keep_a_session_alive(client, alice, settings):
    from dashboard.middleware import SESSION_KEY

    client.force_login(alice)
    client.get(reverse("dashboard:queue"))
    session = client.session
    session[SESSION_KEY] = session[SESSION_KEY] - 100
    session.save()
    stamp = client.session[SESSION_KEY]
    assert client.get("/favicon.ico").status_code == 200
    client.get(f"{settings.STATIC_URL}no-such-file.css")
    assert client.session[SESSION_KEY] == stamp
    client.get(reverse("dashboard:queue"))
    assert client.session[SESSION_KEY] > stamp  # what the person asks for does


def test_activity_is_recorded_at_most_once_a_minute(client, alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboard.middleware import ACTIVITY_RESOLUTION_S, SESSION_KEY

    client.force_login(alice)
    client.get(reverse("dashboard:queue"))
    session = client.session
    session[SESSION_KEY] = session[SESSION_KEY] - ACTIVITY_RESOLUTION_S + 10
    session.save()
    stamp = client.session[SESSION_KEY]
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(reverse("dashboard:queue")).status_code == 200
    # Recent enough: the page view neither moves the stamp nor writes the session row.
    assert client.session[SESSION_KEY] == stamp
    assert not [
        q for q in ctx.captured_queries if q["sql"].startswith("UPDATE") and "django_session" in q["sql"]
    ]
    session = client.session
    session[SESSION_KEY] = stamp - 100
    session.save()
    client.get(reverse("dashboard:queue"))
    # Older than a minute: the page view records the activity again.
    assert client.session[SESSION_KEY] > stamp


@pytest.mark.parametrize("name", ["queue", "approvals", "insights", "policies"])
def test_every_page_carries_a_strict_csp(client, alice, name):
    client.force_login(alice)
    response = client.get(reverse(f"dashboard:{name}"))
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    body = response.content.decode()
    assert "<script>" not in body and "style=" not in body and "<style" not in body
    assert 'hx-headers=\'{"x-csrftoken"' in body
    assert '"includeIndicatorStyles": false' in body and '"allowEval": false' in body


def test_the_run_page_and_login_carry_the_csp_too(client, failed_run, alice):
    run, _item = failed_run
    response = client.get(reverse("login"))
    assert "unsafe-inline" not in response["Content-Security-Policy"]
    client.force_login(alice)
    response = client.get(reverse("dashboard:run-detail", args=[run.pk]))
    assert "unsafe-inline" not in response["Content-Security-Policy"]
    body = response.content.decode()
    assert "style=" not in body and "<script>" not in body


def test_a_percentile_without_data_is_drawn_as_no_data_not_zero():
    from dashboard.presenters.charts import bar_chart

    chart = bar_chart([("p50", None), ("p95", 4.0)], unit="s")
    assert [b.display for b in chart.bars] == ["no data", "4s"]
    assert chart.bars[0].width == 0 and chart.bars[1].width == 300


def test_open_counts_by_risk_and_by_reason_add_up_across_both_panels(tenant, agent, alice):
    from dashboard.selectors import insights as insights_selectors
    from recovery.models import RecoveryItem

    items = [onboarding_run(tenant, agent, name=f"P{i}", email=f"p{i}@company.com")[1] for i in range(4)]
    RecoveryItem.objects.filter(pk=items[0].pk).update(risk="high", reason="agent_lost")
    RecoveryItem.objects.filter(pk=items[1].pk).update(risk="high")
    RecoveryItem.objects.filter(pk=items[2].pk).update(reason="agent_lost")
    item_close(item=items[3], actor=Actor.for_user(alice), reason="done")
    m = insights_selectors.insights(user=alice, window="7d")
    assert dict(m.open_by_risk) == {"Low": 0, "Medium": 1, "High": 2, "Critical": 0}
    assert dict(m.open_by_reason) == {"Run failed": 1, "Agent lost (no heartbeat)": 2}
