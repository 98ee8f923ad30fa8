from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.services import runs
from recovery.services.compensating import unwind_start
from recovery.services.reports import run_fail_and_queue
from tests.factories import load_onboarding_policies, onboarding_run, perform_action

pytestmark = pytest.mark.django_db


def _url(run):
    return reverse("dashboard:run-detail", args=[run.pk])


def test_it_shows_the_ledger_the_checkpoint_and_the_audit_log(client, failed_run, carol):
    run, item = failed_run
    client.force_login(carol)
    response = client.get(_url(run))
    assert response.status_code == 200
    body = response.content.decode()
    for text in (
        "hr.create_user",
        "workspace.provision_license",
        "email.send_welcome",
        "429 rate limited",
        "The HR ticket asks for an account first.",
        "87%",
        "account-created",
        "Latest",
        "Resume at licence provisioning.",
        'id="audit"',
        "run.failed",
        "onboarding-agent",
        "https://traces.example.com/t/123",
        "hire-ashu@company.com",
    ):
        assert text in body, text
    # The snapshot diff names each field and says how it changed, not only with colour.
    assert "license" in body and "business-standard" in body and "changed" in body


def test_a_viewer_sees_no_decision_buttons(client, failed_run, carol):
    run, item = failed_run
    client.force_login(carol)
    body = client.get(_url(run)).content.decode()
    assert reverse("dashboard:item-compensate", args=[item.pk]) not in body
    assert "can look but not decide" in body


def test_an_operator_sees_the_decision_buttons(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    body = client.get(_url(run)).content.decode()
    for name in ("item-compensate", "item-resume", "item-close"):
        assert reverse(f"dashboard:{name}", args=[item.pk]) in body


def test_an_outsider_gets_404(client, failed_run, mallory):
    run, _item = failed_run
    client.force_login(mallory)
    assert client.get(_url(run)).status_code == 404


def test_it_warns_about_unknown_outcomes_and_offers_reconcile(client, tenant, agent, alice):
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="crm-agent", request="Fix the contact owner")
    action = perform_action(
        run,
        agent,
        "crm.update_contact",
        target_id="c-1",
        args={"owner": "x"},
        before={"owner": "y"},
        unknown=True,
    )
    client.force_login(alice)
    body = client.get(_url(run)).content.decode()
    assert "Outcome unknown" in body and "reconcile" in body.lower()
    assert reverse("dashboard:action-reconcile", args=[action.pk]) in body


def test_it_shows_the_correction_trail_with_a_copy_button(client, failed_run, carol):
    run, _item = failed_run
    client.force_login(carol)
    body = client.get(_url(run)).content.decode()
    assert 'id="trail"' in body and 'data-copy-target="trail-text"' in body
    assert "Not undone" in body or "not be undone" in body


def test_the_run_page_query_count_does_not_grow_with_rows(
    client, tenant, agent, alice, django_assert_max_num_queries
):
    small, _ = onboarding_run(tenant, agent, name="Small", email="small@company.com")
    big, _ = onboarding_run(tenant, agent, name="Big", email="big@company.com", extra_actions=8)
    client.force_login(alice)
    client.get(_url(small))
    with CaptureQueriesContext(connection) as baseline:
        client.get(_url(small))
    with django_assert_max_num_queries(len(baseline.captured_queries)):
        response = client.get(_url(big))
    assert len(response.context["p"].actions) == 11


def test_the_run_page_with_an_unwind_keeps_a_flat_query_count(
    client, tenant, agent, alice, django_assert_max_num_queries
):
    from ledger.audit import Actor

    small, small_item = onboarding_run(tenant, agent, name="Small", email="small@company.com")
    big, big_item = onboarding_run(tenant, agent, name="Big", email="big@company.com", extra_actions=6)
    for item in (small_item, big_item):
        unwind_start(item=item, actor=Actor.for_user(alice), reason="undo")
    client.force_login(alice)
    client.get(_url(small))
    with CaptureQueriesContext(connection) as baseline:
        client.get(_url(small))
    with django_assert_max_num_queries(len(baseline.captured_queries)):
        response = client.get(_url(big))
    assert response.context["p"].unwind.steps.count() == 8


def test_a_long_ledger_shows_its_newest_actions_and_the_rest_on_demand(
    client, tenant, agent, alice, monkeypatch
):
    import re

    from dashboard.views import runs as run_views

    monkeypatch.setattr(run_views, "ACTIONS_SHOWN", 4)
    run, _item = onboarding_run(tenant, agent, name="Long", email="long@company.com", extra_actions=4)
    seqs = list(run.actions.order_by("seq").values_list("seq", flat=True))
    assert len(seqs) == 7
    client.force_login(alice)

    def shown(body: str) -> list[int]:
        return [int(s) for s in re.findall(r'<li class="action [^"]*" id="action-(\d+)"', body)]

    body = client.get(_url(run)).content.decode()
    # The newest four (the failure is the last), and a way to the three before them.
    assert shown(body) == seqs[3:] and "Show the 3 earlier actions" in body
    earlier = client.get(
        _url(run), {"actions": "all"}, headers={"HX-Request": "true", "HX-Target": "earlier-actions"}
    ).content.decode()
    assert "<html" not in earlier and shown(earlier) == seqs[:3]
    # Without JavaScript, the link shows the whole ledger.
    everything = client.get(_url(run), {"actions": "all"}).content.decode()
    assert shown(everything) == seqs and "earlier action" not in everything


def test_a_run_that_checkpoints_in_a_loop_keeps_a_bounded_page(client, tenant, agent, alice):
    """An agent writing hundreds of checkpoints (and events) must not make the page unbounded:
    the newest are shown and the rest counted, and the resume form offers the newest only."""
    from dashboard.selectors.runs import RUN_PAGE_CHECKPOINTS, RUN_PAGE_EVENTS
    from ledger.models import Checkpoint, Event
    from ledger.services.checkpoints import checkpoint_write

    run = runs.run_create(tenant=tenant, actor=agent, agent="looping-agent", request="loop")
    for n in range(RUN_PAGE_EVENTS + 5):
        checkpoint_write(run=run, actor=agent, name=f"step-{n:03d}")
    item = run_fail_and_queue(run=run, actor=agent, error="looped").item
    total_events = Event.objects.filter(run=run).count()
    client.force_login(alice)
    body = client.get(_url(run)).content.decode()
    assert body.count('<li class="checkpoint') == RUN_PAGE_CHECKPOINTS
    assert f"step-{RUN_PAGE_EVENTS + 4:03d}" in body and "step-000" not in body
    assert f"{RUN_PAGE_EVENTS + 5 - RUN_PAGE_CHECKPOINTS} older checkpoints not shown" in body
    assert f"{total_events - RUN_PAGE_EVENTS} older events not shown" in body
    form = client.get(reverse("dashboard:item-resume", args=[item.pk])).content.decode()
    assert form.count("<option") == RUN_PAGE_CHECKPOINTS + 1  # + "Latest checkpoint"
    # An older checkpoint named in the link is still this run's and can be chosen.
    oldest = Checkpoint.objects.get(run=run, name="step-000")
    chosen = client.get(reverse("dashboard:item-resume", args=[item.pk]), {"checkpoint": oldest.pk})
    assert "step-000" in chosen.content.decode()
