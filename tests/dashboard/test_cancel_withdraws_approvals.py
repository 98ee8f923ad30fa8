"""Cancelling a run from the dashboard withdraws the approvals its actions waited for: the
confirmation says so and lists them, and after it the inbox no longer shows them."""

from __future__ import annotations

import pytest
from django.urls import reverse

from ledger.models import Event
from tests.factories import gated_run

pytestmark = pytest.mark.django_db


def test_the_cancel_confirmation_lists_the_waiting_approvals_and_confirming_withdraws_them(
    client, tenant, agent, alice
):
    run, action, approval = gated_run(tenant, agent)
    client.force_login(alice)
    page = client.get(reverse("dashboard:run-cancel", args=[run.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'data-effect="withdrawn"' in body and "1 approval still waited for is withdrawn" in body
    assert "<code>payments.refund</code>" in body
    assert approval.pk in client.get(reverse("dashboard:approvals")).content.decode()

    confirmed = client.post(reverse("dashboard:run-cancel", args=[run.pk]), {"reason": "customer withdrew"})
    assert confirmed.status_code == 303, confirmed.content
    approval.refresh_from_db()
    action.refresh_from_db()
    assert (approval.status, action.status) == ("expired", "rejected")
    withdrawn = Event.objects.get(run_id=run.pk, kind="approval.withdrawn")
    cancel = Event.objects.get(run_id=run.pk, kind="run.cancelled")
    assert (withdrawn.actor_type, withdrawn.actor_id) == ("user", str(alice.pk))
    assert (withdrawn.actor_type, withdrawn.actor_id) == (cancel.actor_type, cancel.actor_id)
    assert approval.pk not in client.get(reverse("dashboard:approvals")).content.decode()


def test_a_run_without_waiting_approvals_says_nothing_of_them(client, failed_run, alice):
    client.force_login(alice)
    body = client.get(reverse("dashboard:run-cancel", args=[failed_run[0].pk])).content.decode()
    assert 'data-effect="withdrawn"' not in body
