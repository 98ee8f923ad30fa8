"""The Pauses page: who sees and who decides, the two-step pause (confirmation first), the lift,
plain-sentence refusals, and the banner on a run a pause covers."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from infra import errors
from ledger.audit import Actor
from ledger.models import Event, Pause
from ledger.services import pauses
from tests.factories import make_run, record

pytestmark = pytest.mark.django_db

URL = "/pauses/"


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def _body(**fields) -> dict:
    return {"agent": "", "tool": "payments.*", "reason": "refund bug, INC-42", **fields}


def test_the_nav_links_the_page_for_operators_only(client, alice, carol):
    assert reverse("dashboard:pauses") == URL
    client.force_login(alice)
    assert f'href="{URL}"' in client.get(reverse("dashboard:queue")).content.decode()
    client.force_login(carol)
    assert f'href="{URL}"' not in client.get(reverse("dashboard:queue")).content.decode()
    page = client.get(URL)  # a viewer may read the page, without the form
    assert page.status_code == 200
    assert b"Pause an agent or a tool" not in page.content


def test_an_operator_pauses_after_a_confirmation_that_says_what_will_be_refused(client, tenant, agent, alice):
    run = make_run(tenant, agent)
    record(run, agent, "k1", tool="payments.charge")
    client.force_login(alice)
    confirm = client.post(URL, _body())
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Confirm the pause" in html
    assert "New actions of tool payments.* are refused with 409 paused, in every run of every agent." in html
    assert "Right now 1 running run matches" in html
    assert not Pause.objects.exists()  # nothing happens before the confirmation
    done = client.post(URL, {**_body(), "confirmed": "yes"})
    assert done.status_code == 303
    pause = Pause.objects.get()
    assert (pause.tool, pause.created_by, pause.reason) == ("payments.*", alice, "refund bug, INC-42")
    assert any("Paused tool payments.*" in m for m in _messages(done))
    assert Event.objects.filter(kind="pause.created", actor_label="alice").count() == 1


def test_a_pause_naming_nothing_or_without_reason_is_a_sentence_not_a_pause(client, alice):
    client.force_login(alice)
    response = client.post(URL, _body(tool="  ", confirmed="yes"))
    assert response.status_code == 422
    assert "A pause names an agent, a tool or both" in response.content.decode()
    response = client.post(URL, _body(reason="", confirmed="yes"))
    assert response.status_code == 422
    assert "A reason is required." in response.content.decode()
    assert not Pause.objects.exists()


def test_viewers_approvers_and_outsiders_cannot_pause_or_lift(client, tenant, alice, bob, carol, mallory):
    pause = pauses.pause_create(tenant=tenant, actor=Actor.for_user(alice), tool="x.*", reason="r")
    lift = reverse("dashboard:pause-lift", args=[pause.pk])
    for user, status in ((bob, 403), (carol, 403), (mallory, 404)):
        client.force_login(user)
        assert client.post(lift, {"reason": "mine"}).status_code == status, user.username
        assert client.get(lift).status_code == status, user.username
    for user in (bob, carol):
        client.force_login(user)
        assert client.post(URL, {**_body(), "confirmed": "yes"}).status_code == 403
    assert Pause.objects.count() == 1 and Pause.objects.get().is_active


def test_an_operator_lifts_a_pause_and_a_second_lift_is_a_message(client, tenant, alice):
    pause = pauses.pause_create(tenant=tenant, actor=Actor.for_user(alice), agent="onboarding", reason="loop")
    lift = reverse("dashboard:pause-lift", args=[pause.pk])
    client.force_login(alice)
    preview = client.get(lift)
    assert (
        "New runs of agent onboarding, and new actions in its runs, are accepted again"
        in preview.content.decode()
    )
    assert client.post(lift, {"reason": ""}).status_code == 422
    done = client.post(lift, {"reason": "fixed in v2.3"})
    assert done.status_code == 303
    assert Pause.objects.get().lift_reason == "fixed in v2.3"
    again = client.post(lift, {"reason": "again"})
    assert again.status_code == 303
    assert any("already lifted" in m for m in _messages(again))
    page = client.get(URL).content.decode()
    assert "Recently lifted" in page and "fixed in v2.3" in page


def test_the_run_page_shows_a_banner_while_a_pause_covers_the_run(client, tenant, agent, alice, carol):
    run = make_run(tenant, agent)
    record(run, agent, "k1", tool="hr.create_user")
    url = reverse("dashboard:run-detail", args=[run.pk])
    client.force_login(carol)
    assert b"data-pause-banner" not in client.get(url).content
    pause = pauses.pause_create(tenant=tenant, actor=Actor.for_user(alice), tool="hr.*", reason="HR API bug")
    html = client.get(url).content.decode()
    assert (
        "data-pause-banner" in html
        and "<strong>Tool hr.*</strong> is paused by alice" in html
        and "HR API bug" in html
    )
    pauses.pause_lift(pause=pause, actor=Actor.for_user(alice), reason="fixed")
    assert b"data-pause-banner" not in client.get(url).content


def test_the_banner_shows_on_the_run_a_pause_stopped_though_it_never_used_the_tool(
    client, tenant, agent, alice, carol
):
    """The run had used only hr.create_user; the pause of payments.* refused its first refund. The
    refusal is on the run (an ``action.refused`` event, no action row), and the banner names the
    pause and the refused tool there — and not on another run of the tenant it did not stop."""
    from recovery.actions.approvals import action_record_gated

    stopped, untouched = make_run(tenant, agent), make_run(tenant, agent)
    for run in (stopped, untouched):
        record(run, agent, f"hire-{run.pk}", tool="hr.create_user")
    pause = pauses.pause_create(
        tenant=tenant, actor=Actor.for_user(alice), tool="payments.*", reason="refund bug, INC-42"
    )
    with pytest.raises(errors.Paused):
        action_record_gated(
            run=stopped, actor=agent, tool="payments.refund", idempotency_key="refund-1", args={"amount": 40}
        )
    assert not stopped.actions.filter(tool="payments.refund").exists()
    client.force_login(carol)
    html = client.get(reverse("dashboard:run-detail", args=[stopped.pk])).content.decode()
    assert "data-pause-banner" in html and f'data-pause="{pause.pk}"' in html
    assert "<strong>Tool payments.*</strong> is paused by alice" in html and "refund bug, INC-42" in html
    assert "It stopped this run: <code>payments.refund</code> refused" in html
    other = client.get(reverse("dashboard:run-detail", args=[untouched.pk])).content.decode()
    assert "data-pause-banner" not in other
    # Lifted, the pause leaves the banner; the refusal stays in the run's audit trail.
    pauses.pause_lift(pause=pause, actor=Actor.for_user(alice), reason="fixed")
    html = client.get(reverse("dashboard:run-detail", args=[stopped.pk])).content.decode()
    assert "data-pause-banner" not in html and "action.refused" in html
