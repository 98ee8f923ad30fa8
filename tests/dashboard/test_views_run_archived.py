"""The run page of a run retention archived (tests/support/archived.py): 410 with when, where and
how to verify it, for anyone of its tenant; the 404 of a run that never existed for anyone else;
no decision about it changes anything."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ledger.models import Event, Run
from recovery.models import RecoveryItem
from tests.support.archived import archive_run_for_test

pytestmark = pytest.mark.django_db

ARCHIVE = "s3://saga-archive/acme/2026/11/onboarding.manifest.json"


@pytest.fixture
def archived(failed_run):
    run, _item = failed_run
    return archive_run_for_test(run, ARCHIVE)


def test_the_run_page_says_it_was_archived_when_where_and_how_to_verify(client, archived, carol):
    client.force_login(carol)
    response = client.get(reverse("dashboard:run-detail", args=[archived.run_id]))
    assert response.status_code == 410
    body = response.content.decode()
    assert "This run was archived" in body
    assert archived.run_id in body and ARCHIVE in body
    assert archived.archived_at.isoformat() in body
    assert f"python manage.py verify_audit --archive {ARCHIVE}" in body
    assert archived.manifest_sha256 in body and archived.head in body


def test_an_outsider_gets_the_404_of_a_run_that_never_was(client, archived, mallory):
    client.force_login(mallory)
    for name in ("run-detail", "run-live", "run-flag", "run-cancel"):
        response = client.get(reverse(f"dashboard:{name}", args=[archived.run_id]))
        assert response.status_code == 404, name
        assert ARCHIVE not in response.content.decode()


def test_decisions_about_an_archived_run_are_410_and_change_nothing(client, archived, alice):
    client.force_login(alice)
    events, items = Event.objects.count(), RecoveryItem.objects.count()
    for name in ("run-flag", "run-cancel"):
        url = reverse(f"dashboard:{name}", args=[archived.run_id])
        assert client.get(url).status_code == 410, name
        response = client.post(url, {"reason": "still mine"})
        assert response.status_code == 410, name
        assert ARCHIVE in response.content.decode()
    assert (Event.objects.count(), RecoveryItem.objects.count()) == (events, items)
    assert not Run.objects.filter(pk=archived.run_id).exists()


def test_the_live_poll_of_a_run_archived_meanwhile_reloads_the_page(client, archived, carol):
    client.force_login(carol)
    response = client.get(
        reverse("dashboard:run-live", args=[archived.run_id]), headers={"HX-Request": "true"}
    )
    assert response.headers.get("HX-Refresh") == "true"
    # A reload shows the archived page.
    assert client.get(reverse("dashboard:run-detail", args=[archived.run_id])).status_code == 410
