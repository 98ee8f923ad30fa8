from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from recovery.models import RecoveryItem
from recovery.transitions import items as recovery_items
from tests.factories import onboarding_run

pytestmark = pytest.mark.django_db

QUEUE = reverse("dashboard:queue")


def test_it_sends_anonymous_users_to_login(client):
    response = client.get(QUEUE)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_shows_the_failed_run_to_every_role(client, failed_run, alice, bob, carol, dave):
    run, item = failed_run
    for user in (alice, bob, carol, dave):
        client.force_login(user)
        response = client.get(QUEUE)
        assert response.status_code == 200
        body = response.content.decode()
        assert "Onboard new hire Ashu Kumar" in body
        assert "email.send_welcome" in body
        assert reverse("dashboard:run-detail", args=[run.pk]) in body


def test_it_hides_other_tenants_items(client, failed_run, mallory):
    client.force_login(mallory)
    body = client.get(QUEUE).content.decode()
    assert "Ashu Kumar" not in body
    assert "Nothing needs a decision" in body


def test_it_filters_and_searches(client, tenant, agent, alice):
    run_a, _ = onboarding_run(tenant, agent, name="Ashu Kumar", email="ashu@company.com")
    run_b, _ = onboarding_run(tenant, agent, name="Bea Lind", email="bea@company.com")
    client.force_login(alice)
    for term in (run_a.pk, "ashu@company.com", "Ashu", "hire-ashu@company.com"):
        body = client.get(QUEUE, {"q": term}).content.decode()
        assert "Ashu Kumar" in body and "Bea Lind" not in body, term
    body = client.get(QUEUE, {"q": "send_welcome"}).content.decode()
    assert "Ashu Kumar" in body and "Bea Lind" in body
    assert "Nothing needs a decision" in client.get(QUEUE, {"risk": "critical"}).content.decode()
    assert "Ashu Kumar" in client.get(QUEUE, {"reason": "failed"}).content.decode()
    assert "Nothing needs a decision" in client.get(QUEUE, {"status": "resolved"}).content.decode()
    # Invalid filter values fall back to defaults instead of failing the page.
    assert client.get(QUEUE, {"risk": "purple", "sort": "sideways"}).status_code == 200


def test_it_marks_items_past_the_sla_in_words(client, failed_run, alice, settings):
    _run, item = failed_run
    RecoveryItem.objects.filter(pk=item.pk).update(opened_at=timezone.now() - timedelta(hours=2))
    client.force_login(alice)
    body = client.get(QUEUE).content.decode()
    assert "past SLA" in body
    # The threshold in words, as the setting says it (SAGA_QUEUE_SLA_MINUTES, whole minutes).
    assert f"Items older than {settings.SAGA['QUEUE_SLA_MINUTES']} minutes are marked" in body
    assert client.get(QUEUE, {"age": "1h"}).content.decode().count("Ashu Kumar") == 1
    assert "Nothing needs a decision" in client.get(QUEUE, {"age": "4h"}).content.decode()


def test_it_paginates_with_a_keyset_cursor_in_every_sort(client, tenant, agent, alice, settings):
    settings.SAGA = {**settings.SAGA, "PAGE_SIZE": 2}
    runs = [onboarding_run(tenant, agent, name=f"Person {i}", email=f"p{i}@company.com")[0] for i in range(5)]
    client.force_login(alice)
    for sort in ("newest", "oldest", "risk"):
        seen: list[str] = []
        params = {"sort": sort}
        for _ in range(5):
            response = client.get(QUEUE, params)
            seen += [r.run_id for r in response.context["page"].items]
            cursor = response.context["page"].next_cursor
            if not cursor:
                break
            params = {"sort": sort, "cursor": cursor}
        assert sorted(seen) == sorted(r.pk for r in runs) and len(seen) == 5, sort
    # A tampered cursor shows the first page rather than an error.
    assert client.get(QUEUE, {"cursor": "not-a-cursor"}).status_code == 200


def test_the_load_more_request_returns_only_rows(client, tenant, agent, alice, settings):
    settings.SAGA = {**settings.SAGA, "PAGE_SIZE": 1}
    onboarding_run(tenant, agent, name="One", email="one@company.com")
    onboarding_run(tenant, agent, name="Two", email="two@company.com")
    client.force_login(alice)
    cursor = client.get(QUEUE).context["page"].next_cursor
    response = client.get(QUEUE, {"cursor": cursor}, headers={"HX-Request": "true", "HX-Target": "load-more"})
    body = response.content.decode()
    assert "<html" not in body and "queue-row" in body and "One" in body


def test_the_poll_reports_new_items_without_replacing_the_list(client, tenant, agent, alice):
    onboarding_run(tenant, agent, name="First", email="first@company.com")
    client.force_login(alice)
    since = client.get(QUEUE).context["since"]
    poll = reverse("dashboard:queue-new")
    response = client.get(poll, {"since": since}, headers={"HX-Request": "true"})
    assert response.status_code == 200 and "new item" not in response.content.decode()
    onboarding_run(tenant, agent, name="Second", email="second@company.com")
    response = client.get(poll, {"since": since}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "1 new item" in body and "<table" not in body
    assert 'hx-trigger="every 15s"' in body


def test_the_poll_stops_without_a_reference_time(client, alice):
    client.force_login(alice)
    response = client.get(reverse("dashboard:queue-new"), headers={"HX-Request": "true"})
    assert response.status_code == 286


def test_it_groups_similar_failures_with_a_count(client, tenant, agent, alice):
    for i in range(3):
        onboarding_run(tenant, agent, name=f"Hire {i}", email=f"h{i}@company.com")
    client.force_login(alice)
    response = client.get(QUEUE)
    groups = response.context["groups"]
    assert len(groups) == 1 and groups[0].count == 3 and groups[0].tool == "email.send_welcome"
    # The group's error is its newest item's (the items share it up to normalisation).
    newest = RecoveryItem.objects.filter(signature=groups[0].signature).order_by("-id").first()
    assert newest is not None and groups[0].error == newest.error != ""
    assert "3×" in response.content.decode()
    filtered = client.get(QUEUE, {"signature": groups[0].signature})
    assert len(filtered.context["page"].items) == 3


def test_the_bulk_checkbox_is_offered_only_to_operators_for_low_risk_items(client, failed_run, alice, carol):
    _run, item = failed_run
    RecoveryItem.objects.filter(pk=item.pk).update(risk="low")
    client.force_login(alice)
    assert f'value="{item.pk}"' in client.get(QUEUE).content.decode()
    client.force_login(carol)
    body = client.get(QUEUE).content.decode()
    assert f'value="{item.pk}"' not in body and "Bulk decision" not in body


def test_the_queue_query_count_does_not_grow_with_rows(
    client, tenant, agent, alice, django_assert_max_num_queries
):
    # Two similar failures, so the groups panel (and its tool lookup) is there in both counts.
    onboarding_run(tenant, agent, name="Only", email="only@company.com")
    onboarding_run(tenant, agent, name="Other", email="other@company.com")
    client.force_login(alice)
    client.get(QUEUE)  # warm the session and content types
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as one:
        client.get(QUEUE)
    for i in range(6):
        onboarding_run(tenant, agent, name=f"More {i}", email=f"more{i}@company.com")
    with django_assert_max_num_queries(len(one.captured_queries)):
        response = client.get(QUEUE)
    assert len(response.context["page"].items) == 8
    assert response.context["groups"][0].count == 8


def test_an_empty_queue_still_polls_for_new_items(client, tenant, agent, alice):
    client.force_login(alice)
    response = client.get(QUEUE, {"sort": "oldest"})
    since = response.context["since"]
    assert since and reverse("dashboard:queue-new") in response.content.decode()
    onboarding_run(tenant, agent, name="Late", email="late@company.com")
    poll = client.get(reverse("dashboard:queue-new"), {"since": since, "sort": "oldest"})
    assert "1 new item" in poll.content.decode()


def test_the_search_finds_items_by_the_text_kept_on_them_as_their_failure_changes(
    client, tenant, agent, alice
):
    from ledger.audit import Actor

    run, item = onboarding_run(tenant, agent, name="Cleo Park", email="cleo@company.com")
    assert item.search_text == "email.send_welcome\nonboard new hire cleo park (cleo@company.com)"
    client.force_login(alice)
    assert "Cleo Park" in client.get(QUEUE, {"q": "SEND_WELCOME"}).content.decode()
    assert "Cleo Park" in client.get(QUEUE, {"q": "new hire cleo"}).content.decode()
    # The run fails again at another action: the item (and what it is found by) follows.
    other = run.actions.exclude(pk=item.failed_action_id).order_by("seq").first()
    recovery_items.item_open_or_update(
        run=run, reason="failed", actor=Actor.for_user(alice), failed_action=other
    )
    item.refresh_from_db()
    assert item.search_text.startswith(other.tool.lower() + "\n")
    assert "Cleo Park" in client.get(QUEUE, {"q": other.tool}).content.decode()
    assert "Cleo Park" not in client.get(QUEUE, {"q": "send_welcome"}).content.decode()
