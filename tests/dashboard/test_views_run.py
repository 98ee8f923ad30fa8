from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ledger.services import runs
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
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
    trail_url = reverse("dashboard:run-trail", args=[run.pk])
    # The page loads its trail by a request of its own once it is up (htmx), and links to it.
    page = client.get(_url(run)).content.decode()
    assert f'hx-get="{trail_url}" hx-trigger="load"' in page and f'href="{trail_url}"' in page
    for headers in ({"HX-Request": "true", "HX-Target": "trail-slot"}, {}):
        body = client.get(trail_url, headers=headers).content.decode()
        assert 'id="trail"' in body and 'data-copy-target="trail-text"' in body
        assert "What changed" in body and "hr.create_user" in body
        assert ("<html" in body) is not bool(headers)


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


def _shown(body: str) -> list[int]:
    import re

    return [int(s) for s in re.findall(r'<li class="action [^"]*" id="action-(\d+)"', body)]


def _load_more(body: str) -> str | None:
    """The URL the run page's Load more (htmx) gets, if the page has one."""
    import html
    import re

    found = re.search(r'<li id="load-more"[^>]*>\s*<a [^>]*hx-get="([^"]+)"', body)
    return html.unescape(found.group(1)) if found else None


HTMX_LOAD_MORE = {"HX-Request": "true", "HX-Target": "load-more"}


def test_a_long_ledger_shows_its_newest_actions_and_the_older_ones_a_page_at_a_time(
    client, tenant, agent, alice, monkeypatch
):
    from dashboard.selectors import runs as run_selectors

    monkeypatch.setattr(run_selectors, "RUN_PAGE_ACTIONS", 3)
    run, _item = onboarding_run(tenant, agent, name="Long", email="long@company.com", extra_actions=4)
    seqs = list(run.actions.order_by("seq").values_list("seq", flat=True))
    assert len(seqs) == 7
    client.force_login(alice)

    body = client.get(_url(run)).content.decode()
    # The newest three (the failure is the last), and Load more for the page before them.
    assert _shown(body) == seqs[4:]
    seen, url = list(_shown(body)), _load_more(body)
    while url is not None:
        # Load more with htmx sends back only the older page's rows, and its own Load more.
        fragment = client.get(url, headers=HTMX_LOAD_MORE).content.decode()
        assert "<html" not in fragment
        seen = _shown(fragment) + seen
        url = _load_more(fragment)
    # Every action once, in order: no duplicate, no gap between pages.
    assert seen == seqs
    # Without JavaScript, the link opens the page with the older actions and a way back.
    older = client.get(_load_more(body).split("?", 1)[0], {"cursor": _load_more(body).split("cursor=", 1)[1]})
    page = older.content.decode()
    assert older.status_code == 200 and _shown(page) == seqs[1:4] and "Back to the newest actions" in page


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "WzBd" * 200,
        "W1siYSJdXQ",
        "WyJ4Il0",
        "WzEsMl0",
        "WzEuNV0",
        "W3RydWVd",
        "%00",
        "WzEwMDAwMDAwMDAwMDAwMDAwMDAwMDBd",
    ],
)
def test_a_cursor_the_run_page_did_not_hand_out_is_a_bad_request_not_an_error(
    client, failed_run, alice, cursor
):
    run, _item = failed_run
    client.force_login(alice)
    for headers in ({}, HTMX_LOAD_MORE):
        response = client.get(_url(run), {"cursor": cursor}, headers=headers)
        # A huge integer is a cursor of the right shape: a page (empty or not), never a 500.
        assert response.status_code in (200, 400), (cursor, headers, response.status_code)
        if cursor not in ("WzEwMDAwMDAwMDAwMDAwMDAwMDAwMDBd",):
            assert response.status_code == 400, (cursor, headers)


def test_equal_timestamps_do_not_skip_or_repeat_actions_across_pages(
    client, tenant, agent, alice, monkeypatch
):
    """Actions recorded in one transaction share their timestamps; the run page pages by seq."""
    from dashboard.selectors import runs as run_selectors
    from ledger.models import Action

    monkeypatch.setattr(run_selectors, "RUN_PAGE_ACTIONS", 2)
    run, _item = onboarding_run(tenant, agent, name="Same", email="same@company.com", extra_actions=5)
    Action.objects.filter(run=run).update(created_at=run.created_at, updated_at=run.created_at)
    client.force_login(alice)
    body = client.get(_url(run)).content.decode()
    seen, url = _shown(body), _load_more(body)
    while url is not None:
        fragment = client.get(url, headers=HTMX_LOAD_MORE).content.decode()
        seen, url = _shown(fragment) + seen, _load_more(fragment)
    assert seen == list(run.actions.order_by("seq").values_list("seq", flat=True))


def test_the_run_page_and_its_load_more_run_as_many_queries_for_5000_actions_as_for_a_few(
    client, tenant, agent, alice, django_assert_max_num_queries
):
    """The page reads one page of the ledger whatever its length."""
    from ledger.models import Action

    small, _ = onboarding_run(tenant, agent, name="Small", email="small@company.com")
    big, _ = onboarding_run(tenant, agent, name="Big", email="big@company.com")
    # Thousands of actions, written as the seeding command does (the services would take minutes).
    template = Action.objects.filter(run=big).order_by("seq").first()
    start = big.actions.count()
    rows = []
    for n in range(5000):
        row = Action.objects.get(pk=template.pk)
        row.pk = None
        row.id = f"act_bulk{n:010d}"
        row.seq = start + n + 1
        row.idempotency_key = f"bulk-{n}"
        row.status = "succeeded"
        rows.append(row)
    Action.objects.bulk_create(rows)
    client.force_login(alice)
    for url_of in (lambda run: _url(run),):
        client.get(url_of(small))
        with CaptureQueriesContext(connection) as baseline:
            small_body = client.get(url_of(small)).content.decode()
        with django_assert_max_num_queries(len(baseline.captured_queries)):
            big_body = client.get(url_of(big)).content.decode()
    assert len(_shown(big_body)) == 50
    with CaptureQueriesContext(connection) as more_small:
        client.get(_load_more(small_body) or _url(small), headers=HTMX_LOAD_MORE)
    with django_assert_max_num_queries(max(len(more_small.captured_queries), 1) + 1):
        fragment = client.get(_load_more(big_body), headers=HTMX_LOAD_MORE).content.decode()
    assert len(_shown(fragment)) == 50


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
