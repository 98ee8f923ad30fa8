"""The run page tells the run's state as it is now: the breadcrumb names where the run is reached
from, the header's error is current only while the run is failed (or being compensated) and
history after that, and the poll re-renders the notice and the resume-wait panel as the run moves
on, with the same partials as the page."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.urls import reverse

from ledger.audit import Actor
from ledger.models import Run
from ledger.services import runs
from recovery.actions import commands
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.actions.resolutions import item_close, item_resume
from recovery.models import AgentCommand
from recovery.transitions.items import item_assign
from tests.factories import load_onboarding_policies, perform_action

pytestmark = pytest.mark.django_db


def _page(client, run: Run) -> str:
    return client.get(reverse("dashboard:run-detail", args=[run.pk])).content.decode()


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def _breadcrumb(html: str) -> str:
    start = html.index('id="run-breadcrumb"')
    return html[start : html.index("</nav>", start)]


def _error_line(html: str) -> str:
    """The header's error paragraph ("" when the header shows none)."""
    start = html.index('id="run-summary"')
    summary = html[start : html.index('id="run-decisions"', start)]
    match = re.search(r'<p [^>]*data-run-error="(\w+)"[^>]*>(.*?)</p>', summary, re.S)
    return f"{match.group(1)}: {_text(match.group(2)).strip()}" if match else ""


def _live_query(html: str) -> dict[str, str]:
    start = html.index('id="run-live"')
    tag = html[start : html.index(">", start)]
    url = tag.split('hx-get="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    return dict(parse_qsl(urlsplit(url).query))


def _poll(client, run: Run, query: dict[str, str]):
    return client.get(reverse("dashboard:run-live", args=[run.pk]), query, headers={"HX-Request": "true"})


def _oob(body: str, element_id: str) -> str:
    """The out-of-band element the poll sent for ``element_id`` (its opening tag to its end)."""
    start = body.index(f'id="{element_id}" ')
    return body[body.rindex("<", 0, start) :]


@pytest.fixture
def plain_run(tenant, agent):
    """A run that never failed: nothing about it is in the recovery queue."""
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="mailer", request="Welcome Ashu")
    perform_action(run, agent, "email.send_welcome", target_id="ashu", args={"to": "ashu"})
    return run


def _resumed(run: Run, item, alice) -> AgentCommand:
    return item_resume(item=item, actor=Actor.for_user(alice), reason="the rate limit lifted")


# --- Breadcrumb ---------------------------------------------------------------------------------


def test_a_run_never_in_the_queue_is_reached_from_the_runs_list(client, plain_run, alice):
    client.force_login(alice)
    crumb = _breadcrumb(_page(client, plain_run))
    assert f'href="{reverse("dashboard:runs")}">Runs</a>' in crumb
    assert "Recovery queue" not in crumb


def test_a_run_with_an_open_item_is_reached_from_the_queue(client, failed_run, alice):
    run, _item = failed_run
    client.force_login(alice)
    crumb = _breadcrumb(_page(client, run))
    assert f'href="{reverse("dashboard:queue")}">Recovery queue</a>' in crumb


def test_a_run_whose_item_was_decided_leads_to_the_queue_listing_it(client, failed_run, alice):
    run, item = failed_run
    item_close(item=item, actor=Actor.for_user(alice), reason="handled by hand")
    client.force_login(alice)
    crumb = _breadcrumb(_page(client, run))
    assert f'href="{reverse("dashboard:queue")}?status=all&amp;q={run.pk}">Recovery queue</a>' in crumb


def test_the_breadcrumb_follows_a_run_that_fails_while_its_page_is_open(client, tenant, agent, alice):
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="mailer", request="Welcome Ashu")
    client.force_login(alice)
    query = _live_query(_page(client, run))
    run_fail_and_queue(run=run, actor=agent, error="mail server down")
    body = _poll(client, run, query).content.decode()
    crumb = _oob(body, "run-breadcrumb")
    assert crumb.startswith(
        '<nav id="run-breadcrumb" class="breadcrumbs" aria-label="Breadcrumb" hx-swap-oob="true">'
    )
    assert ">Recovery queue</a>" in crumb.split("</nav>")[0]


# --- The header's error -------------------------------------------------------------------------


def test_a_failed_run_shows_its_error_as_current(client, failed_run, alice):
    run, _item = failed_run
    client.force_login(alice)
    assert _error_line(_page(client, run)) == f"current: Error: {run.error}"


def test_after_a_resume_the_error_is_history(client, failed_run, agent, alice):
    run, item = failed_run
    command = _resumed(run, item, alice)
    client.force_login(alice)
    assert _error_line(_page(client, run)) == f"history: Failed earlier: {run.error}, then resumed."

    commands.command_ack(command=command, actor=agent)
    runs.run_complete(run=Run.objects.get(pk=run.pk), actor=agent)
    page = _page(client, run)
    assert _error_line(page) == f"history: Failed earlier: {run.error}, then resumed."
    assert 'data-run-error="current"' not in page


def test_while_compensating_the_error_is_current_and_after_it_history(client, failed_run, alice):
    run, item = failed_run
    unwind_start(item=item, actor=Actor.for_user(alice), reason="undo the onboarding")
    client.force_login(alice)
    assert _error_line(_page(client, run)) == f"current: Error: {run.error}"
    runs.run_compensation_finished(run=Run.objects.get(pk=run.pk), actor=Actor.system("tests"), complete=True)
    assert _error_line(_page(client, run)) == f"history: Failed earlier: {run.error}, then compensated."


def test_a_run_that_never_failed_shows_no_error(client, plain_run, alice):
    client.force_login(alice)
    assert _error_line(_page(client, plain_run)) == ""


# --- The poll: notice, resume panel, header -----------------------------------------------------


def test_the_poll_replaces_the_resume_notice_and_panel_as_the_run_moves_on(client, failed_run, agent, alice):
    run, item = failed_run
    client.force_login(alice)
    response = client.post(
        reverse("dashboard:item-resume", args=[item.pk]), {"reason": "the rate limit lifted"}
    )
    assert response.status_code == 303
    page = client.get(response["Location"]).content.decode()
    notices = page[page.index('id="run-notices"') :].split("</div>")[0]
    assert "Resume command issued" in notices
    assert 'id="resume-wait-slot"' in page and "not picked up" in page

    query = _live_query(page)
    assert _poll(client, run, query).status_code == 204

    # The agent picks the resume up: the panel and the notice go; the run is still running.
    command = AgentCommand.objects.get(run=run, kind=AgentCommand.Kind.RESUME)
    commands.command_ack(command=command, actor=agent)
    body = _poll(client, run, query).content.decode()
    slot = _oob(body, "resume-wait-slot").split("</div>")[0]
    assert 'hx-swap-oob="true"' in slot and "not picked up" not in slot
    notices = _oob(body, "run-notices").split("</div>")[0]
    assert 'hx-swap-oob="true"' in notices and "Resume command issued" not in notices
    assert '<p class="message' not in notices

    # It succeeds: the notice says so, the header's error is history.
    query = _live_query(body)
    runs.run_complete(run=Run.objects.get(pk=run.pk), actor=agent)
    body = _poll(client, run, query).content.decode()
    notices = _text(_oob(body, "run-notices").split("</div>")[0])
    assert "Now: the run succeeded at" in notices
    summary = _oob(body, "run-summary")
    assert 'data-run-status="succeeded"' in summary and 'data-run-error="history"' in summary
    assert 'data-run-error="current"' not in body
    # The correction trail, which tells the run's state, follows it in the same answer.
    assert 'id="trail-slot" hx-swap-oob="true"' in body and "the run succeeded" in body


def test_the_poll_replaces_the_compensation_notice_with_its_outcome(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    response = client.post(reverse("dashboard:item-compensate", args=[item.pk]), {"reason": "undo it"})
    page = client.get(response["Location"]).content.decode()
    assert "Compensation started" in page.split('id="run-notices"', 1)[1].split("</div>")[0]
    query = _live_query(page)

    runs.run_compensation_finished(run=Run.objects.get(pk=run.pk), actor=Actor.system("tests"), complete=True)
    body = _poll(client, run, query).content.decode()
    notices = _text(_oob(body, "run-notices").split("</div>")[0])
    assert "Compensation started" not in notices
    assert "Now: the compensation finished at" in notices and "the run is compensated" in notices


def test_an_assignment_elsewhere_leaves_the_notice_alone(client, failed_run, alice, dave):
    run, item = failed_run
    client.force_login(alice)
    query = _live_query(_page(client, run))
    item_assign(item=item, actor=Actor.for_user(dave), assignee=dave)
    body = _poll(client, run, query).content.decode()
    assert 'id="run-summary"' in body  # the header shows the assignee's change
    assert 'id="run-notices"' not in body
