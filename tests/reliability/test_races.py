"""Scenarios 5, 6 and 7: racing identical requests through a live server, operators and a stale
tab racing on one item, and an agent writing after its run was cancelled or closed."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from ledger.audit import Actor
from ledger.models import Action, Checkpoint, Event, IdempotencyRecord, Run
from ledger.services import checkpoints, runs
from ledger.services.actions import moves
from recovery.actions.approvals import action_record_gated
from recovery.actions.reports import run_fail_and_queue
from recovery.actions.resolutions import item_close
from recovery.models import AgentCommand, RecoveryItem, Unwind
from tests.factories import failed_saga, load_reliability_policies
from tests.support.api import Api
from tests.support.processes import wait_for

pytestmark = pytest.mark.timeout(120)

RACERS = 50


def _race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run every call at once (a barrier releases them together); each thread closes its own
    database connection."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            results[index] = call()
        except Exception as exc:  # noqa: BLE001 - reported by the assertions, not lost in a thread
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    return results


@pytest.mark.django_db(transaction=True)
def test_scenario_5_fifty_identical_requests_one_key(live_server, agent_key, outsider_key, results):
    """Pass: 50 concurrent POST /runs with one Idempotency-Key create exactly one run (every answer
    is the 201, its replay, or 409 in flight); 50 concurrent action records with one key create
    one action; the same key with another body is 422 idempotency_key_reused; the same key from
    another tenant's key is independent (its own 201 and its own row); no response is a 5xx."""
    url = f"{live_server.url}/api/v1"
    body = {"agent": "racer", "request": "one run, please"}

    retries = 0

    def post(secret: str, path: str, payload: dict[str, Any], key: str | None = None) -> httpx.Response:
        # The test server's listen backlog is small: a refused connection is retried with the
        # same key, as any client would, which is what the key is for.
        nonlocal retries
        headers = {"Authorization": f"Bearer {secret}", **({"Idempotency-Key": key} if key else {})}
        for attempt in range(5):
            try:
                with httpx.Client(timeout=60) as client:
                    return client.post(f"{url}{path}", json=payload, headers=headers)
            except httpx.TransportError:
                if attempt == 4:
                    raise
                retries += 1
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    run_answers = _race([lambda: post(agent_key[1], "/runs", body, "race-key-1") for _ in range(RACERS)])
    assert not [r for r in run_answers if isinstance(r, Exception)], run_answers
    statuses = [r.status_code for r in run_answers]
    assert set(statuses) <= {201, 409}, statuses
    created = {r.json()["id"] for r in run_answers if r.status_code == 201}
    assert len(created) == 1
    replays = [
        r for r in run_answers if r.status_code == 201 and r.headers.get("Idempotent-Replayed") == "true"
    ]
    assert len(replays) == statuses.count(201) - 1
    assert Run.objects.filter(agent="racer").count() == 1
    run_id = created.pop()

    action = {
        "tool": "hr.create_user",
        "idempotency_key": "race-action",
        "target_id": "ashu",
        "args": {"n": 1},
    }
    action_answers = _race(
        [lambda: post(agent_key[1], f"/runs/{run_id}/actions", action) for _ in range(RACERS)]
    )
    assert not [r for r in action_answers if isinstance(r, Exception)], action_answers
    action_statuses = [r.status_code for r in action_answers]
    assert set(action_statuses) <= {200, 201, 409}, action_statuses
    assert action_statuses.count(201) == 1
    assert Action.objects.filter(run_id=run_id).count() == 1

    reused = post(agent_key[1], "/runs", {**body, "request": "another body"}, "race-key-1")
    assert reused.status_code == 422 and reused.json()["error"]["code"] == "idempotency_key_reused"
    theirs = post(outsider_key[1], "/runs", body, "race-key-1")
    assert theirs.status_code == 201 and theirs.headers.get("Idempotent-Replayed") is None
    assert theirs.json()["id"] != run_id
    assert IdempotencyRecord.objects.filter(key="race-key-1").count() == 2
    everything = [*statuses, *action_statuses, reused.status_code, theirs.status_code]
    server_errors = sum(1 for s in everything if s >= 500)
    assert server_errors == 0
    results.record(
        "5-idempotent-races",
        requests=len(everything),
        rows_created=2,
        in_flight_409=statuses.count(409) + action_statuses.count(409),
        connection_retries=retries,
        duplicates_observed=0,
        lost_intents=0,
        server_errors=server_errors,
    )


def _dashboard(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _messages_on(client: Client, run_id: str) -> str:
    return client.get(reverse("dashboard:run-detail", args=[run_id])).content.decode()


@pytest.mark.django_db(transaction=True)
def test_scenario_6_two_operators_and_a_stale_tab(
    tenant, agent, alice, dave, operator_key, hooks, start_worker, results
):
    """Pass: Alice (dashboard, compensate), Dave (dashboard, close) and a supervisor key (API,
    compensate) act on one item at the same instant, then Alice's stale tab compensates again and
    the key closes again: exactly one decision wins; every loser gets the current state (the API a
    409 invalid_transition naming it, the dashboard a message saying what the item is now); each
    refused attempt is in the audit log as decision.refused; at most one unwind exists and, when
    a compensation won, exactly one ran to completion; nothing is a 5xx."""
    load_reliability_policies(hooks=hooks)
    saga = failed_saga(tenant, agent, steps=2)
    item = saga.item
    start_worker()
    alice_tab, alice_stale_tab, dave_tab = _dashboard(alice), _dashboard(alice), _dashboard(dave)
    api = Api(operator_key[1])
    compensate_url = reverse("dashboard:item-compensate", args=[item.pk])
    close_url = reverse("dashboard:item-close", args=[item.pk])

    first = _race(
        [
            lambda: alice_tab.post(compensate_url, {"reason": "alice: undo it"}),
            lambda: dave_tab.post(close_url, {"reason": "dave: leave it"}),
            lambda: api.post(f"/recovery/{item.pk}/compensate", {"reason": "bot: undo it"}),
        ]
    )
    assert not [r for r in first if isinstance(r, Exception)], first
    stale = alice_stale_tab.post(compensate_url, {"reason": "alice again, from an old tab"})
    again = api.post(f"/recovery/{item.pk}/close", {"reason": "bot: close it"})
    responses = [*first, stale, again]
    assert all(r.status_code < 500 for r in responses), [r.status_code for r in responses]

    item.refresh_from_db()
    assert item.status in (RecoveryItem.Status.CLAIMED, RecoveryItem.Status.RESOLVED)
    unwinds = list(Unwind.objects.filter(run=saga.run))
    compensated = bool(unwinds)
    assert len(unwinds) <= 1
    api_first, api_again = first[2], again
    wins = [
        first[0].status_code == 303 and compensated and unwinds[0].requested_by == alice,
        first[1].status_code == 303 and item.resolution == RecoveryItem.Resolution.CLOSED,
        api_first.status_code == 202,
    ]
    assert sum(wins) == 1, (wins, [r.status_code for r in responses])
    for response in (r for r in (api_first, api_again) if r.status_code != 202 and r.status_code != 200):
        error = response.json()["error"]
        assert response.status_code == 409 and error["code"] == "invalid_transition", error
        assert error["details"]["current"] in ("claimed", "resolved")
    # Losing dashboard tabs are sent back to the run page with the current state in words.
    for client, response, won in (
        (alice_tab, first[0], wins[0]),
        (dave_tab, first[1], wins[1]),
        (alice_stale_tab, stale, False),
    ):
        assert response.status_code == 303
        if not won:
            page = _messages_on(client, saga.run.pk)
            assert "cannot become" in page or "already" in page, page[:2000]
    refused = Event.objects.filter(run=saga.run, kind="decision.refused")
    assert refused.count() == 4, list(refused.values_list("actor_label", "to_state", "reason"))
    assert {e.from_state for e in refused} <= {"claimed", "resolved"}
    if compensated:
        wait_for(
            lambda: Unwind.objects.get(pk=unwinds[0].pk).status == Unwind.Status.COMPLETED,
            timeout=60,
            what="the one unwind to complete",
        )
        assert Event.objects.filter(run=saga.run, kind="unwind.started").count() == 1
        assert dict(hooks.effects) == {a.pk: 1 for a in saga.actions}
    results.record(
        "6-operators-race",
        attempts=len(responses),
        winners=1,
        refused_audited=refused.count(),
        unwinds_completed=len(unwinds),
        duplicates_observed=0,
        lost_intents=0,
        server_errors=0,
    )


@pytest.mark.django_db(transaction=True)
def test_scenario_7_stale_resume_and_writes_after_cancel_or_close(
    tenant, agent, agent_key, operator_key, alice, results
):
    """Pass: resuming from a checkpoint written before later actions succeeded is flagged stale
    (API preview and dashboard preview name the actions that would repeat); after a run is
    cancelled or closed, every agent write (new action, start, succeed, fail, checkpoint, complete,
    fail the run) is refused with 409 and changes nothing (row counts, statuses, audit events)."""
    load_reliability_policies()
    # A stale checkpoint: written after the first action, before the second succeeded.
    run = runs.run_create(tenant=tenant, actor=agent, agent="reliability", request="two steps")
    first = action_record_gated(run=run, actor=agent, tool="rel.do_1", idempotency_key="s7-1").action
    moves.action_start(action=first, actor=agent)
    moves.action_succeed(action=first, actor=agent, result={"ok": 1})
    checkpoints.checkpoint_write(run=run, actor=agent, name="after step 1", completed_action_ids=[first.pk])
    second = action_record_gated(run=run, actor=agent, tool="rel.do_2", idempotency_key="s7-2").action
    moves.action_start(action=second, actor=agent)
    moves.action_succeed(action=second, actor=agent, result={"ok": 2})
    item = run_fail_and_queue(run=run, actor=agent, error="step 3 failed").item

    detail = Api(operator_key[1]).get(f"/recovery/{item.pk}").json()
    preview = detail["resume_preview"]
    assert preview["stale"] is True
    assert [a["id"] for a in preview["succeeded_after"]] == [second.pk]
    assert "stale_checkpoint" in [w["code"] for w in preview["warnings"]]
    page = _dashboard(alice).get(reverse("dashboard:item-resume", args=[item.pk])).content.decode()
    assert "rel.do_2" in page and "after step 1" in page

    api = Api(agent_key[1])
    refusals = 0
    for ending in ("cancel", "close"):
        victim = runs.run_create(tenant=tenant, actor=agent, agent="late", request=f"{ending} me")
        planned = action_record_gated(
            run=victim, actor=agent, tool="rel.do_1", idempotency_key=f"{ending}-planned"
        ).action
        running = action_record_gated(
            run=victim, actor=agent, tool="rel.do_2", idempotency_key=f"{ending}-running"
        ).action
        moves.action_start(action=running, actor=agent)
        if ending == "cancel":
            runs.run_cancel(run=victim, actor=agent, reason="the user withdrew")
        else:
            victim_item = run_fail_and_queue(run=victim, actor=agent, error="gave up").item
            item_close(item=victim_item, actor=Actor.for_user(alice), reason="nothing to undo")
        before = _snapshot(victim)
        writes = [
            ("post", f"/runs/{victim.pk}/actions", {"tool": "rel.do_3", "idempotency_key": f"{ending}-late"}),
            ("post", f"/actions/{planned.pk}/start", None),
            ("post", f"/actions/{running.pk}/succeed", {"result": {"late": True}}),
            ("post", f"/actions/{running.pk}/fail", {"error": "late", "retryable": False, "layer": "tool"}),
            ("post", f"/runs/{victim.pk}/checkpoints", {"name": "late checkpoint"}),
            ("post", f"/runs/{victim.pk}/complete", {"summary": "done, honest"}),
            ("post", f"/runs/{victim.pk}/fail", {"error": "late failure"}),
        ]
        for _method, path, body in writes:
            response = api.post(path, body)
            assert response.status_code == 409, (ending, path, response.status_code, response.content)
            refusals += 1
        assert _snapshot(victim) == before, ending
    results.record(
        "7-stale-resume-late-writes",
        stale_warnings=1,
        late_writes_refused=refusals,
        changes_after_refusal=0,
        duplicates_observed=0,
        lost_intents=0,
        server_errors=0,
    )


def _snapshot(run: Run) -> dict[str, Any]:
    run.refresh_from_db()
    return {
        "run": (run.status, run.action_count, run.completion_count, run.summary, run.error),
        "actions": sorted(Action.objects.filter(run=run).values_list("pk", "status", "attempts", "result")),
        "checkpoints": Checkpoint.objects.filter(run=run).count(),
        "events": Event.objects.filter(run=run).count(),
        "commands": AgentCommand.objects.filter(run=run).count(),
    }
