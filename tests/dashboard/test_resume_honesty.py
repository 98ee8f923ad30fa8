"""The dashboard side of an honest resume: the Resume form says whether the agent is alive, and a
resume the agent has not picked up is shown on the run page and the queue row."""

from __future__ import annotations

import re
from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from ledger.audit import Actor
from ledger.models import Run
from recovery.actions import commands
from recovery.actions.periodic import agents_detect_lost
from recovery.actions.resolutions import item_resume
from recovery.models import AgentCommand

SILENCE_WARNING = "The agent has not been heard from for"


def _text(response) -> str:
    """The page's words, tags and runs of white space collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def _heard_from(run: Run, *, ago: timedelta) -> None:
    Run.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now() - ago)


def test_the_resume_form_shows_when_the_agent_was_last_heard_from(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    _heard_from(run, ago=timedelta(seconds=40))

    page = _text(client.get(reverse("dashboard:item-resume", args=[item.pk])))

    assert "Agent last heard from:" in page and "(just now)" in page
    assert SILENCE_WARNING not in page
    assert "it is not compensated automatically" in page


def test_the_resume_form_warns_when_the_agent_is_silent(client, failed_run, alice, settings):
    settings.SAGA = {**settings.SAGA, "HEARTBEAT_TIMEOUT_S": 300}
    run, item = failed_run
    client.force_login(alice)
    _heard_from(run, ago=timedelta(minutes=12, seconds=5))

    page = _text(client.get(reverse("dashboard:item-resume", args=[item.pk])))

    assert "(12 minutes ago)" in page
    assert (
        "The agent has not been heard from for 12 minutes; a resume command waits until it comes back."
        in page
    )
    # The htmx swap of the preview (another checkpoint chosen) keeps it.
    partial = client.get(reverse("dashboard:item-resume", args=[item.pk]), headers={"HX-Request": "true"})
    assert SILENCE_WARNING in _text(partial)


def test_the_run_page_says_the_resume_was_not_picked_up(client, failed_run, alice, settings):
    settings.SAGA = {**settings.SAGA, "RESUME_ACK_TIMEOUT_S": 180, "HEARTBEAT_TIMEOUT_S": 300}
    run, item = failed_run
    client.force_login(alice)
    _heard_from(run, ago=timedelta(minutes=20))
    command = item_resume(item=item, actor=Actor.for_user(alice), reason="the gateway is back")
    AgentCommand.objects.filter(pk=command.pk).update(created_at=timezone.now() - timedelta(minutes=6))
    run_url = reverse("dashboard:run-detail", args=[run.pk])

    page = _text(client.get(run_url))

    assert "Resume sent 6 minutes ago, not picked up" in page
    assert "alice resumed this run at" in page
    assert "The agent has not been heard from since" in page and "(20 minutes ago)" in page
    assert "this was announced to the notification recipients" in page
    assert "the run comes back to the recovery queue as agent lost and waits for a person" in page

    # The queue row of the resumed item (Status: resolved) says it too.
    queue = _text(client.get(reverse("dashboard:queue"), {"status": "resolved"}))
    assert "Resume sent 6 minutes ago, not picked up" in queue

    # Picked up: nothing more to say.
    commands.command_ack(command=command, actor=Actor.system("agent"))
    assert "not picked up" not in _text(client.get(run_url))
    assert "not picked up" not in _text(client.get(reverse("dashboard:queue"), {"status": "resolved"}))


def test_a_fresh_resume_is_shown_but_not_yet_on_the_queue(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    item_resume(item=item, actor=Actor.for_user(alice), reason="go on")
    Run.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now())  # the agent is back

    page = _text(client.get(reverse("dashboard:run-detail", args=[run.pk])))
    assert "not picked up" in page and "The agent is alive" in page and "has not acknowledged it" in page
    assert "If it is not acknowledged within 3 minutes" in page
    assert "not picked up" not in _text(client.get(reverse("dashboard:queue"), {"status": "all"}))


def test_the_queue_row_of_a_run_lost_after_a_resume_says_who_resumed_it(client, failed_run, alice):
    run, item = failed_run
    client.force_login(alice)
    command = item_resume(item=item, actor=Actor.for_user(alice), reason="go on")
    AgentCommand.objects.filter(pk=command.pk).update(created_at=timezone.now() - timedelta(hours=1))
    Run.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert agents_detect_lost() == 1

    queue = _text(client.get(reverse("dashboard:queue")))
    assert (
        "Resumed by alice 1 hour ago; the agent never picked it up. Not compensated automatically." in queue
    )
