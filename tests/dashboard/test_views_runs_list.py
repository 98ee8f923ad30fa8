"""The Runs page: every run of the user's tenants (not only the queue's), its filters, an exact id
that opens the run, keyset pages, hostile query strings, who is offered Cancel and Flag, and the
queue's hint when its search names a run it does not list."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from infra.pagination import MAX_CURSOR_LENGTH
from ledger.models import Run
from ledger.services import runs
from recovery.actions.reports import run_fail_and_queue
from tests.factories import load_reliability_policies, perform_action, record

pytestmark = pytest.mark.django_db

RUNS = reverse("dashboard:runs")
QUEUE = reverse("dashboard:queue")


def _run(tenant, actor, request, *, agent="onboarding", status="running", tool="", target="", **fields):
    run = runs.run_create(tenant=tenant, actor=actor, agent=agent, request=request, **fields)
    if tool:
        perform_action(run, actor, tool, target_id=target or f"{request}-target", args={"r": request})
    if status == "succeeded":
        runs.run_complete(run=run, actor=actor)
    elif status == "failed":
        run_fail_and_queue(run=run, actor=actor, error="boom")
    run.refresh_from_db()
    return run


@pytest.fixture
def ledger(tenant, agent):
    """Acme's runs: one running (a CRM update under way), one succeeded (a welcome e-mail sent),
    one failed into the queue; each started a minute after the one before."""
    load_reliability_policies()
    running = _run(tenant, agent, "Update Bea's CRM record", tool="rel.do_crm_update_contact", target="crm-9")
    done = _run(
        tenant,
        agent,
        "Welcome Ashu",
        agent="mailer",
        status="succeeded",
        tool="rel.do_send_welcome",
        external_id="ticket-4711",
    )
    failed = _run(tenant, agent, "Refund Cleo", agent="billing", status="failed", tool="rel.do_refund")
    start = timezone.now() - timedelta(hours=3)
    for minutes, run in enumerate((failed, done, running)):
        Run.objects.filter(pk=run.pk).update(created_at=start + timedelta(minutes=minutes))
    return {"running": running, "done": done, "failed": failed, "start": start}


def _listed(response) -> list[str]:
    assert response.status_code == 200, response.status_code
    return [row["run"].pk for row in response.context["rows"]]


def _problems(response) -> list[str]:
    assert response.status_code == 200, response.status_code
    return response.context["problems"]


def test_it_sends_anonymous_users_to_login(client):
    response = client.get(RUNS)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_it_lists_every_run_newest_first_running_and_succeeded_too(client, ledger, carol):
    client.force_login(carol)
    response = client.get(RUNS)
    assert _listed(response) == [ledger["running"].pk, ledger["done"].pk, ledger["failed"].pk]
    body = response.content.decode()
    assert "Update Bea&#x27;s CRM record" in body and "Welcome Ashu" in body
    assert f'href="{RUNS}" aria-current="page">Runs</a>' in body


def test_it_shows_only_the_users_tenants(client, ledger, other_tenant, outsider_key, alice, mallory):
    from ledger.audit import Actor

    theirs = _run(other_tenant, Actor.for_key(outsider_key[0]), "Globex's own run")
    client.force_login(mallory)
    assert _listed(client.get(RUNS)) == [theirs.pk]
    # Another tenant's run id, external id or text finds nothing (and opens nothing).
    for term in (ledger["done"].pk, "ticket-4711", "Welcome"):
        response = client.get(RUNS, {"q": term})
        assert _listed(response) == [], term
        assert "No runs match these filters." in response.content.decode()
    client.force_login(alice)
    assert theirs.pk not in _listed(client.get(RUNS))
    assert _listed(client.get(RUNS, {"tenant": "globex"})) == []


def test_it_filters_by_agent_status_tool_and_time(client, ledger, alice):
    client.force_login(alice)
    running, done, failed = ledger["running"].pk, ledger["done"].pk, ledger["failed"].pk
    # The agent as operators see it: the name the run declares, or its key's name.
    assert _listed(client.get(RUNS, {"agent": "mailer"})) == [done]
    assert _listed(client.get(RUNS, {"agent": "onboarding-agent"})) == [running, done, failed]
    assert _listed(client.get(RUNS, {"agent": "mail"})) == []
    assert _listed(client.get(RUNS, {"status": "succeeded"})) == [done]
    assert _listed(client.get(RUNS, {"status": "failed", "agent": "billing"})) == [failed]
    assert _listed(client.get(RUNS, {"tool": "rel.do_refund"})) == [failed]
    assert _listed(client.get(RUNS, {"tool": "rel.do_crm_update_*"})) == [running]
    assert _listed(client.get(RUNS, {"tool": "rel.do_re?und"})) == [failed]
    assert _listed(client.get(RUNS, {"tool": "rel.*"})) == [running, done, failed]
    assert _listed(client.get(RUNS, {"tool": "rel.do_crm"})) == []
    # "." in a glob is a dot, not any character; "?" is any one.
    assert _listed(client.get(RUNS, {"tool": "rel.do.refun*"})) == []
    assert _listed(client.get(RUNS, {"tool": "rel?do_refund"})) == [failed]
    middle = (ledger["start"] + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M")
    assert _listed(client.get(RUNS, {"after": middle})) == [running, done]
    assert _listed(client.get(RUNS, {"before": middle})) == [failed]
    assert _listed(client.get(RUNS, {"after": middle, "status": "running"})) == [running]
    assert _listed(client.get(RUNS, {"tenant": "acme", "q": "refund"})) == [failed]


def test_text_search_reads_the_request_and_the_external_id(client, ledger, alice):
    client.force_login(alice)
    assert _listed(client.get(RUNS, {"q": "crm RECORD"})) == [ledger["running"].pk]
    assert _listed(client.get(RUNS, {"q": "ticket-47"})) == [ledger["done"].pk]
    # LIKE's wildcards are text here.
    assert _listed(client.get(RUNS, {"q": "%"})) == []
    assert _listed(client.get(RUNS, {"q": "_"})) == []


def test_an_exact_id_opens_its_run(client, ledger, alice):
    client.force_login(alice)
    done = ledger["done"]
    action = done.actions.get()
    for term in (done.pk, "ticket-4711", action.pk, action.target_id, f"  {done.pk}  "):
        response = client.get(RUNS, {"q": term})
        assert response.status_code == 303, term
        assert response["Location"] == reverse("dashboard:run-detail", args=[done.pk])
    # With htmx (the filter bar), the browser is told where to go.
    response = client.get(RUNS, {"q": done.pk}, headers={"HX-Request": "true", "HX-Target": "runs-results"})
    assert response["HX-Redirect"] == reverse("dashboard:run-detail", args=[done.pk])
    # The other filters still apply: an id whose run they exclude opens nothing.
    assert _listed(client.get(RUNS, {"q": done.pk, "status": "running"})) == []


def test_an_id_several_runs_share_lists_them(client, tenant, agent, alice):
    first = runs.run_create(tenant=tenant, actor=agent, agent="a", request="One", external_id="order-7")
    second = runs.run_create(tenant=tenant, actor=agent, agent="a", request="Two", external_id="order-7")
    runs.run_create(tenant=tenant, actor=agent, agent="a", request="Three order-7 mentioned")
    record(first, agent, "k-1", target_id="shared-target")
    client.force_login(alice)
    response = client.get(RUNS, {"q": "order-7"})
    # Exact external ids only: the run that merely mentions it in its request is not one of them.
    assert _listed(response) == [second.pk, first.pk]
    assert response.context["page"].exact


def test_pages_follow_a_cursor_without_repeating_or_skipping_a_run(client, tenant, agent, alice, settings):
    settings.SAGA = {**settings.SAGA, "PAGE_SIZE": 2}
    made = [runs.run_create(tenant=tenant, actor=agent, agent="bulk", request=f"Run {i}") for i in range(7)]
    # Ties on the start time: the id breaks them, and the cursor carries both.
    same = timezone.now() - timedelta(minutes=5)
    Run.objects.filter(pk__in=[r.pk for r in made[2:6]]).update(created_at=same)
    runs.run_create(tenant=tenant, actor=agent, agent="other", request="Not this agent")
    client.force_login(alice)
    seen: list[str] = []
    params = {"agent": "bulk"}
    for _ in range(10):
        response = client.get(RUNS, params)
        seen += _listed(response)
        cursor = response.context["page"].next_cursor
        if not cursor:
            break
        assert f"?cursor={cursor}&amp;agent=bulk" in response.content.decode()
        params = {"agent": "bulk", "cursor": cursor}
    expected = list(
        Run.objects.filter(agent="bulk").order_by("-created_at", "-id").values_list("pk", flat=True)
    )
    assert seen == expected and len(seen) == 7
    # "Load more" with htmx sends back only the rows.
    response = client.get(
        RUNS, params | {"cursor": ""}, headers={"HX-Request": "true", "HX-Target": "load-more"}
    )
    assert "<form" not in response.content.decode() and 'class="run-row"' in response.content.decode()


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"q": "x" * 1_000_000}, "Run, action or target id, or text: Ensure this value has at most"),
        ({"q": "y" * 600}, "The search is too long (at most 500 characters)."),
        ({"q": "abc\x07"}, "The search may not contain control characters."),
        ({"agent": "a" * 300}, "The agent is too long (at most 200 characters)."),
        ({"agent": "bot\nx"}, "The agent may not contain control characters."),
        ({"status": "purple"}, "Unknown status 'purple'"),
        ({"status": "'; DROP TABLE ledger_run; --"}, "Unknown status"),
        ({"tool": "crm update"}, "The tool must be an exact tool name"),
        ({"tool": "crm.[ab]*"}, "The tool must be an exact tool name"),
        ({"tool": "t" * 201}, "The tool must be"),
        ({"after": "2026-13-45T10:00"}, "Started after (UTC): Enter a date and time like"),
        ({"before": "yesterday"}, "Started before (UTC): Enter a date and time like"),
        ({"after": "99999-01-01T00:00"}, "Enter a date and time like"),
        ({"after": "2026-01-01T00:00+99:00"}, "Enter a date and time like"),
        ({"after": "2026-02-01", "before": "2026-01-01"}, "“Started before” must be later than"),
        ({"tenant": "t" * 5000}, "Tenant: Ensure this value has at most 200 characters"),
    ],
)
def test_a_hostile_query_string_gets_a_sentence_and_lists_nothing(client, ledger, alice, params, said):
    client.force_login(alice)
    response = client.get(RUNS, params)
    problems = _problems(response)
    assert any(said in problem for problem in problems), problems
    assert _listed(response) == []
    body = response.content.decode()
    assert "Fix the filters above to list runs." in body
    # Nothing sent is echoed at length, and the next-page link never carries it.
    assert len(body) < 60_000
    assert "cursor=" not in body


def test_a_nul_anywhere_is_the_sites_bad_request(client, ledger, alice):
    # Refused before any page for every page (saga_admin.api.limits): it cannot reach PostgreSQL.
    client.force_login(alice)
    for params in ({"q": "run_\x00abc"}, {"tool": "a\x00"}, {"cursor": "\x00"}):
        assert client.get(RUNS, params).status_code == 400


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "W1tbW1tbW1tbW1tbW1tbW1tbW1tbW1tbW1tbW10=",  # nested lists
        "WyIyMDI2LTEzLTQ1VDAwOjAwOjAwIiwicnVuX3giXQ",  # an impossible date
        "WzEsMl0",  # numbers where a date and an id belong
        "WyIyMDI2LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwicnVuX1x1MDAwMCJd",  # a NUL in the id
        "A" * (MAX_CURSOR_LENGTH + 1),
    ],
)
def test_a_cursor_the_page_did_not_make_shows_the_first_page(client, ledger, alice, cursor):
    client.force_login(alice)
    response = client.get(RUNS, {"cursor": cursor})
    assert _listed(response) == [ledger["running"].pk, ledger["done"].pk, ledger["failed"].pk]
    assert "That page link is not one this page made" in response.content.decode()


def test_cancel_and_flag_are_offered_to_those_who_may_and_where_the_rule_allows(
    client, ledger, alice, bob, carol, dave
):
    cancel = {r: reverse("dashboard:run-cancel", args=[ledger[r].pk]) for r in ("running", "done", "failed")}
    flag = {r: reverse("dashboard:run-flag", args=[ledger[r].pk]) for r in ("running", "done", "failed")}
    for operator in (alice, dave):
        client.force_login(operator)
        body = client.get(RUNS).content.decode()
        # Running: cancel or flag. Succeeded: flag only. Failed and in the queue: cancel only.
        assert cancel["running"] in body and flag["running"] in body
        assert cancel["done"] not in body and flag["done"] in body
        assert cancel["failed"] in body and flag["failed"] not in body
    for looker in (bob, carol):
        client.force_login(looker)
        body = client.get(RUNS).content.decode()
        assert not any(url in body for url in [*cancel.values(), *flag.values()])
        # The confirmation behind each link is the run page's own, and refuses them too.
        assert client.get(cancel["running"]).status_code == 403
        assert client.post(flag["done"], {"reason": "x"}).status_code == 403


def test_the_query_count_does_not_grow_with_the_page(client, tenant, agent, alice, settings):
    settings.SAGA = {**settings.SAGA, "PAGE_SIZE": 20}
    load_reliability_policies()
    _run(tenant, agent, "First", tool="rel.do_crm_update_contact")
    client.force_login(alice)
    for params in ({}, {"q": "First"}, {"tool": "rel.do_*", "agent": "onboarding"}):
        client.get(RUNS, params)  # warm the session and content types
        with CaptureQueriesContext(connection) as one:
            client.get(RUNS, params)
        for i in range(6):
            _run(tenant, agent, f"First more {i}", tool="rel.do_crm_update_contact", status="failed")
        with CaptureQueriesContext(connection) as many:
            response = client.get(RUNS, params)
        assert len(_listed(response)) > 6
        assert len(many.captured_queries) == len(one.captured_queries), params


# --- The queue's hint -------------------------------------------------------------------------


def test_the_queue_says_when_its_search_names_a_run_it_does_not_list(client, ledger, alice, mallory):
    client.force_login(alice)
    done, running = ledger["done"], ledger["running"]
    for term, run in ((done.pk, done), ("ticket-4711", done), (running.pk, running)):
        body = client.get(QUEUE, {"q": term}).content.decode()
        assert "Nothing needs a decision" in body
        assert "names a run this list does not show" in body, term
        assert f'href="{reverse("dashboard:run-detail", args=[run.pk])}"' in body
        assert f"{RUNS}?q={term}" in body
    # Text is not an id, and another tenant's run is not there for Mallory.
    assert "names a run" not in client.get(QUEUE, {"q": "Welcome"}).content.decode()
    client.force_login(mallory)
    body = client.get(QUEUE, {"q": done.pk}).content.decode()
    assert "Nothing needs a decision" in body and "names a run" not in body
    assert "Welcome Ashu" not in body
