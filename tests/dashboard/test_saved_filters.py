"""Saved queue filters: Alice saves the queue's current filter under a name, finds it as a link with
its count, renames and deletes it; nobody else sees or touches hers; hostile names and queries get a
sentence and change nothing; and the counts beside filters and choices cost a fixed number of
queries, never one per filter or per choice."""

from __future__ import annotations

import re

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard import saved_filters
from dashboard.models import SavedFilter
from infra import errors
from recovery.models import RecoveryItem
from tests.factories import onboarding_run

pytestmark = pytest.mark.django_db

QUEUE = reverse("dashboard:queue")
CREATE = reverse("dashboard:saved-filter-create")


def _messages(response) -> list[str]:
    """The messages this response added (the test client does not follow the redirect that would
    show and consume them, so earlier ones are still queued before them)."""
    said = [str(m) for m in get_messages(response.wsgi_request)]
    return said[-1:]


def _save(client, name: str, query: str):
    return client.post(CREATE, {"name": name, "query": query})


def test_alice_saves_the_current_filter_and_finds_it_with_its_count(client, tenant, agent, alice):
    onboarding_run(tenant, agent, name="Ashu Kumar", email="ashu@company.com")
    onboarding_run(tenant, agent, name="Bea Lind", email="bea@company.com")
    client.force_login(alice)
    page = client.get(QUEUE, {"reason": "failed", "sort": "oldest"}).content.decode()
    assert 'name="query" value="reason=failed&amp;sort=oldest"' in page  # what "Save" sends

    response = _save(client, "  Failed,   oldest first ", "reason=failed&sort=oldest&cursor=abc")
    assert response.status_code == 303
    assert response["Location"] == f"{QUEUE}?reason=failed&sort=oldest"
    assert _messages(response) == ["Saved the filter “Failed, oldest first”."]
    saved = SavedFilter.objects.get(user=alice)
    # Stored as the queue's form reads it (paging dropped, names normalised).
    assert (saved.name, saved.query) == ("Failed, oldest first", "reason=failed&sort=oldest")

    page = client.get(QUEUE).content.decode()
    assert f'href="{QUEUE}?reason=failed&amp;sort=oldest"' in page
    assert 'aria-label="2 matching">2</span>' in page
    # The link opens the queue filtered, itself marked current.
    page = client.get(QUEUE, {"reason": "failed", "sort": "oldest"}).content.decode()
    assert 'sort=oldest" aria-current="true">Failed, oldest first' in page


def test_a_saved_filter_is_read_through_the_queues_form_on_every_use(client, tenant, agent, alice):
    """A stored query the form no longer accepts (a field renamed, a value retired, a row edited
    behind the app's back) is read as the form reads any query: unknown values fall back."""
    onboarding_run(tenant, agent)
    client.force_login(alice)
    SavedFilter.objects.create(user=alice, name="Odd", query="risk=purple&reason=failed&tenant=globex&junk=1")
    page = client.get(QUEUE).content.decode()
    assert f'href="{QUEUE}?reason=failed"' in page and "purple" not in page and "junk" not in page


def test_rename_and_delete_by_their_owner_only(client, tenant, agent, alice, mallory, carol):
    client.force_login(alice)
    _save(client, "Critical", "risk=critical")
    saved = SavedFilter.objects.get(user=alice)
    rename = reverse("dashboard:saved-filter-rename", args=[saved.pk])
    delete = reverse("dashboard:saved-filter-delete", args=[saved.pk])

    for outsider in (mallory, carol):
        client.force_login(outsider)
        assert "data-saved-filter=" not in client.get(QUEUE).content.decode()
        assert client.post(rename, {"name": "Mine now"}).status_code == 404
        assert client.post(delete).status_code == 404
    assert SavedFilter.objects.get(pk=saved.pk).name == "Critical"

    client.force_login(alice)
    assert client.get(rename).status_code == 405
    response = client.post(rename, {"name": "Critical risk"})
    assert _messages(response) == ["Renamed the filter to “Critical risk”."]
    _save(client, "High", "risk=high")
    response = client.post(rename, {"name": "High"})
    assert _messages(response) == ["You already have a filter called “High”; choose another name."]
    assert SavedFilter.objects.get(pk=saved.pk).name == "Critical risk"
    response = client.post(delete)
    assert _messages(response) == ["Deleted the filter “Critical risk”."]
    assert list(SavedFilter.objects.values_list("name", flat=True)) == ["High"]
    assert (
        client.post(reverse("dashboard:saved-filter-rename", args=[10**12]), {"name": "x"}).status_code == 404
    )


@pytest.mark.parametrize(
    ("name", "query", "message"),
    [
        ("", "risk=high", "Give the filter a name."),
        ("   ", "risk=high", "Give the filter a name."),
        ("x" * 81, "risk=high", "A filter's name is at most 80 characters."),
        ("bell\x07", "risk=high", "A filter's name is plain text: no control or formatting characters."),
        ("rtl\u202e", "risk=high", "A filter's name is plain text: no control or formatting characters."),
        ("Purple", "risk=purple", "The filter has values the queue does not accept (risk)"),
        ("Nothing", "", "There is no filter to save"),
        ("Paging", "cursor=abc", "There is no filter to save"),
        ("Huge", "q=" + "a" * 2000, "This filter is too long to save"),
        ("Long search", "q=" + "a" * 501, "The filter has values the queue does not accept (q)"),
    ],
)
def test_hostile_names_and_queries_get_a_sentence_and_save_nothing(client, alice, name, query, message):
    client.force_login(alice)
    response = _save(client, name, query)
    assert response.status_code == 303
    [said] = _messages(response)
    assert said.startswith(message), said
    assert not SavedFilter.objects.exists()


def test_a_name_is_one_per_user_and_a_user_has_at_most_fifty(client, alice, bob):
    client.force_login(alice)
    _save(client, "Mine", "risk=high")
    assert _messages(_save(client, "Mine", "risk=low")) == [
        "You already have a filter called “Mine”; choose another name."
    ]
    client.force_login(bob)  # the same name is Bob's own
    assert _messages(_save(client, "Mine", "risk=low")) == ["Saved the filter “Mine”."]
    SavedFilter.objects.bulk_create(
        SavedFilter(user=alice, name=f"f{n}", query="risk=high")
        for n in range(saved_filters.MAX_PER_USER - 1)
    )
    client.force_login(alice)
    assert _messages(_save(client, "One more", "risk=low")) == [
        "You have 50 saved filters, the most there can be; delete one first."
    ]
    assert SavedFilter.objects.filter(user=alice).count() == saved_filters.MAX_PER_USER


def test_the_service_refuses_what_the_view_would(alice):
    with pytest.raises(errors.ValidationFailed):
        saved_filters.saved_filter_create(user=alice, name="x", query="status=sideways", tenants=[])
    assert not SavedFilter.objects.exists()


def test_counts_cost_the_same_queries_for_one_filter_or_twenty_and_one_grouped_query_for_the_choices(
    client, tenant, agent, alice
):
    onboarding_run(tenant, agent, name="Ashu Kumar", email="ashu@company.com")
    onboarding_run(tenant, agent, name="Bea Lind", email="bea@company.com")
    RecoveryItem.objects.filter(pk=RecoveryItem.objects.order_by("id").first().pk).update(
        reason="agent_lost", risk="low"
    )
    client.force_login(alice)
    client.get(QUEUE)  # warm the session and caches

    def queries_for_the_page() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(QUEUE).status_code == 200
        return len(queries.captured_queries)

    SavedFilter.objects.create(user=alice, name="failed", query="reason=failed")
    with_one = queries_for_the_page()
    for n in range(19):
        SavedFilter.objects.create(user=alice, name=f"risk {n}", query=f"risk={'high' if n % 2 else 'low'}")
    assert queries_for_the_page() == with_one

    page = client.get(QUEUE).content.decode()
    assert re.search(r'reason=failed" data-facet="reason">run failed \(1\)</a>', page)
    assert re.search(r'reason=agent_lost" data-facet="reason">agent lost \(no heartbeat\) \(1\)</a>', page)
    assert re.search(r'risk=low" data-facet="risk">low \(1\)</a>', page)
    with CaptureQueriesContext(connection) as queries:
        client.get(QUEUE)
    grouped = [
        q["sql"] for q in queries.captured_queries if "GROUP BY" in q["sql"] and '"reason"' in q["sql"]
    ]
    assert len(grouped) == 1, "one grouped query for the reason and risk counts"


def test_counts_are_capped_and_tenant_scoped(tenant, agent, alice, mallory):
    from dashboard.selectors import queue as queue_selectors
    from recovery.selectors import QueueFilter

    onboarding_run(tenant, agent)
    views = {1: queue_selectors.QueueView(queue_filter=QueueFilter(status="all"))}
    assert queue_selectors.queue_counts(user=alice, views=views) == {1: 1}
    assert queue_selectors.queue_counts(user=mallory, views=views) == {1: 0}
    assert queue_selectors.queue_facets(user=mallory).total == 0
