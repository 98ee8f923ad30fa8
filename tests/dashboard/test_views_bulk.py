"""Bulk decisions by filter in the dashboard, view by view: offered from the queue only for a filter
that matches something, the preview, the typed confirmation, the bulk's page and its poll, abort,
roles and tenants. (The browser flow with a real worker: tests/e2e/test_operator_decides_in_bulk.py.)"""

from __future__ import annotations

import pytest
from django.urls import reverse

from recovery.actions import bulk_filter, bulk_worker
from recovery.bulk.models import BulkOperation
from recovery.models import RecoveryItem
from tests.recovery.bulk_support import crm_policies, failing_runs

pytestmark = pytest.mark.django_db

QUEUE = reverse("dashboard:queue")
PREVIEW = reverse("dashboard:bulk-preview")


@pytest.fixture
def crm_items(tenant, agent):
    crm_policies()
    return failing_runs(tenant, agent, 3)


def test_it_offers_a_bulk_only_for_a_filter_that_matches(client, alice, crm_items):
    client.force_login(alice)
    assert "decide-all" not in client.get(QUEUE).content.decode()
    assert "Decide all 3 matching" in client.get(QUEUE, {"tool": "crm.update_*"}).content.decode()
    assert "decide-all" not in client.get(QUEUE, {"tool": "nothing.*"}).content.decode()
    assert "Decide all 3 matching" in client.get(QUEUE, {"agent": "crm-sync"}).content.decode()


def test_a_hostile_tool_filter_is_an_error_on_the_page_not_a_500(client, alice, crm_items):
    client.force_login(alice)
    response = client.get(QUEUE, {"tool": "drop table;" * 50, "agent": "a" * 5000})
    assert response.status_code == 200
    assert "decide-all" not in response.content.decode()


def test_it_previews_decides_and_aborts(client, alice, crm_items, django_capture_on_commit_callbacks):
    client.force_login(alice)
    response = client.get(PREVIEW, {"tool": "crm.update_*"})
    body = response.content.decode()
    assert response.status_code == 200
    assert 'data-count="3"' in body and 'data-needs-approval="0"' in body
    # Under the threshold: no typed count is asked for.
    assert "to confirm" not in body
    with django_capture_on_commit_callbacks():
        response = client.post(
            f"{PREVIEW}?tool=crm.update_%2A", {"action": "close", "reason": "CRM outage", "expected_count": 3}
        )
    bulk = BulkOperation.objects.get()
    assert response.status_code == 303 and response["Location"] == reverse(
        "dashboard:bulk-detail", args=[bulk.pk]
    )
    page = client.get(response["Location"]).content.decode()
    assert 'data-bulk-status="running"' in page and "Abort" in page

    bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk, max_items=1)
    poll = client.get(response["Location"], headers={"HX-Request": "true", "HX-Target": "bulk-progress"})
    assert poll.status_code == 200 and 'data-count="done">1<' in poll.content.decode()

    abort = client.post(reverse("dashboard:bulk-abort", args=[bulk.pk]), {"reason": "enough"})
    assert abort.status_code == 303
    bulk_worker.bulk_advance_chunk(bulk_id=bulk.pk)
    bulk.refresh_from_db()
    assert (bulk.status, bulk.done) == ("aborted", 1)
    assert RecoveryItem.objects.filter(pk__in=[i.pk for i in crm_items], status="open").count() == 2
    done = client.get(response["Location"], headers={"HX-Request": "true", "HX-Target": "bulk-progress"})
    assert done.status_code == 286  # htmx: stop polling

    # The run's correction trail (which its page loads) says the bulk decided it.
    trail = client.get(reverse("dashboard:run-trail", args=[bulk.items.get(outcome="done").run_id]))
    assert reverse("dashboard:bulk-detail", args=[bulk.pk]) in trail.content.decode()


def test_it_asks_for_the_count_typed_past_the_threshold(client, alice, crm_items, settings):
    settings.SAGA = {**settings.SAGA, "BULK_CONFIRM_THRESHOLD": 2}
    client.force_login(alice)
    assert "to confirm" in client.get(PREVIEW, {"tool": "crm.update_*"}).content.decode()
    wrong = client.post(
        f"{PREVIEW}?tool=crm.update_%2A",
        {"action": "close", "reason": "CRM outage", "expected_count": 3, "confirm_count": 2},
    )
    assert wrong.status_code == 422 and "Type 3" in wrong.content.decode()
    assert not BulkOperation.objects.exists()


def test_it_refuses_a_changed_count_and_an_empty_filter(client, alice, crm_items):
    client.force_login(alice)
    changed = client.post(
        f"{PREVIEW}?tool=crm.update_%2A", {"action": "close", "reason": "CRM outage", "expected_count": 7}
    )
    assert changed.status_code == 303
    empty = client.get(PREVIEW)
    assert empty.status_code == 303 and empty["Location"] == QUEUE
    assert not BulkOperation.objects.exists()


def test_viewers_and_outsiders_cannot_decide_in_bulk(client, carol, mallory, alice, tenant, crm_items):
    client.force_login(carol)
    assert client.get(PREVIEW, {"tool": "crm.update_*"}).status_code in (303, 403)
    assert "decide-all" not in client.get(QUEUE, {"tool": "crm.update_*"}).content.decode()
    from ledger.audit import Actor
    from recovery.selectors import QueueFilter

    bulk = bulk_filter.bulk_start(
        tenant=tenant,
        queue_filter=QueueFilter(tool="crm.update_*"),
        action="close",
        reason="x",
        actor=Actor.for_user(alice),
        expected_count=3,
    )
    client.force_login(mallory)
    assert client.get(reverse("dashboard:bulk-detail", args=[bulk.pk])).status_code == 404
    assert client.post(reverse("dashboard:bulk-abort", args=[bulk.pk]), {"reason": "x"}).status_code == 404
    client.force_login(carol)
    assert client.post(reverse("dashboard:bulk-abort", args=[bulk.pk]), {"reason": "x"}).status_code == 403
    assert BulkOperation.objects.get(pk=bulk.pk).status == "running"
