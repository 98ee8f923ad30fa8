"""Object-level authorization over EVERY dashboard URL and EVERY API operation, enumerated from the
URL resolver and the OpenAPI document, so a new endpoint cannot escape: another tenant's user or
key gets 404 (existence does not leak), a viewer gets 403 on every decision, an agent-only key gets
403 on every operator endpoint. The deploy check itself is tests/ledger/test_commands.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from dashboard.models import SavedFilter
from ledger.audit import Actor
from ledger.models import Compensator
from ledger.services import checkpoints, pauses, runs
from ledger.services.actions import moves
from recovery import slack
from recovery.actions import channels, commands
from recovery.actions.approvals import action_record_gated
from recovery.actions.bulk_filter import bulk_start
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.models import Approval
from recovery.notifications import email_links
from recovery.selectors import QueueFilter
from tests.factories import gated_run, issue_key
from tests.support.api import Api
from tests.support.archived import archive_run_for_test
from tests.support.routes import dashboard_patterns, fill_route
from tests.support.slack import link_slack_user

# Pages whose view takes no object: tenant scoping there is about what they list, tested by the
# dashboard's own tests. Everything else below must be named in OBJECT_PARAMS.
DECISION_METHODS = {"post"}
# URLs of a person's own objects (saved queue filters), not a tenant's: another person's is 404
# for everyone, a viewer included (the outsider sweep below covers them; tests/dashboard/
# test_saved_filters.py the owner's and another user's).
OWN_OBJECT_URLS = {"dashboard:saved-filter-rename", "dashboard:saved-filter-delete"}
ARCHIVE_URL = "s3://saga-archive/acme/old-run.manifest.json"


@pytest.fixture
def acme_world(tenant, agent, bob):
    """One of every object in Acme: a failed run with an open item and an unwind with a step, an
    action, an approval, a command, a checkpoint."""
    run, _action, approval = gated_run(tenant, agent)
    failed = runs.run_create(tenant=tenant, actor=agent, agent="x", request="y")
    step_action = action_record_gated(
        run=failed,
        actor=agent,
        tool="hr.create_user",
        idempotency_key="w-1",
        compensation={"tool": "hr.delete_user", "args": {}},
    ).action
    moves.action_start(action=step_action, actor=agent)
    moves.action_succeed(action=step_action, actor=agent, result={})
    checkpoint = checkpoints.checkpoint_write(run=failed, actor=agent, name="cp")
    item = run_fail_and_queue(run=failed, actor=agent, error="boom").item
    other = runs.run_create(tenant=tenant, actor=agent, agent="x", request="z")
    undone = action_record_gated(
        run=other,
        actor=agent,
        tool="hr.create_user",
        idempotency_key="w-2",
        compensation={"tool": "hr.delete_user", "args": {}},
    ).action
    moves.action_start(action=undone, actor=agent)
    moves.action_succeed(action=undone, actor=agent, result={})
    other_item = run_fail_and_queue(run=other, actor=agent, error="boom").item
    unwind = unwind_start(item=other_item, actor=Actor.system("tests"), reason="undo")
    command = commands.command_issue(run=failed, kind="resume", actor=Actor.system("tests"), reason="go")
    # A pause of a tool nothing here calls: it exists, and stops nothing the world needs.
    pause = pauses.pause_create(tenant=tenant, actor=Actor.system("tests"), tool="never.called", reason="x")
    channel = channels.channel_create(
        tenant=tenant, actor=Actor.system("tests"), name="on-call", kind="email", target="oncall@acme.test"
    ).channel
    channels.slack_app_set(
        tenant=tenant, actor=Actor.system("tests"), signing_secret="acme-signing-secret-0000"
    )
    link = link_slack_user(tenant=tenant, user=bob, team_id="T1", slack_user_id="U1")
    compensator = Compensator.objects.create(
        tenant=tenant, tool="hr.delete_user", kind="webhook", url="http://127.0.0.1:9/undo", secret="s"
    )
    bulk = bulk_start(
        tenant=tenant,
        queue_filter=QueueFilter(reason=item.reason),
        action="close",
        reason="one of every object",
        actor=Actor.for_user(bob),
        expected_count=QueueFilter(reason=item.reason).items(tenants=[tenant]).count(),
    )
    # A saved filter is its owner's alone: anyone else (an outsider, a viewer) gets 404.
    saved = SavedFilter.objects.create(user=bob, name="failed", query="reason=failed")
    # A run retention archived: 410 to Acme, the 404 of a run that never was to anyone else.
    archived = archive_run_for_test(
        runs.run_create(tenant=tenant, actor=agent, agent="x", request="old"), ARCHIVE_URL
    )
    return {
        "tenant_id": str(tenant.pk),
        "compensator_id": str(compensator.pk),
        "run_id": failed.pk,
        "item_id": item.pk,
        "action_id": step_action.pk,
        "approval_id": approval.pk,
        "unwind_id": unwind.pk,
        "step_id": unwind.steps.first().pk,
        "command_id": command.pk,
        "checkpoint_id": checkpoint.pk,
        "gated_run_id": run.pk,
        "pause_id": pause.pk,
        "slug": tenant.slug,
        "channel_id": channel.pk,
        "link_id": str(link.pk),
        "bulk_id": bulk.pk,
        "pk": str(saved.pk),
        "archived_run_id": archived.run_id,
        # A Slack press's confirmation link: Bob's, on Acme's approval.
        "token": slack.press_token(
            slack.PressRequest(
                approval_id=approval.pk,
                user_id=bob.pk,
                approve=True,
                args_hash=approval.args_hash,
                slack_user="T0ACME/UBOB",
            )
        ),
        # An approval e-mail's decision link: Bob's, on Acme's approval.
        "link": email_links.link_token(
            email_links.DecisionLink(
                approval_id=approval.pk,
                user_id=bob.pk,
                approve=True,
                args_hash=approval.args_hash,
                nonce="acme-world",
            )
        ),
    }


def test_the_enumeration_finds_the_dashboard_and_its_decisions():
    names = {name for _route, name in dashboard_patterns()}
    assert {
        "dashboard:item-compensate",
        "dashboard:item-close",
        "dashboard:approval-approve",
        "dashboard:step-retry",
        "dashboard:run-detail",
    } <= names


@pytest.mark.django_db
def test_an_outsider_gets_404_on_every_dashboard_url_with_an_object(acme_world, mallory):
    """Pass: Mallory (operator at Globex) gets 404 for GET and POST on every Acme object URL."""
    client = Client()
    client.force_login(mallory)
    checked = 0
    for route, name in dashboard_patterns():
        if "<" not in route:
            continue
        url = fill_route(route, acme_world)
        for method in ("get", "post"):
            response = getattr(client, method)(url, {"reason": "mine now"})
            if response.status_code == 405:
                continue
            assert response.status_code == 404, (name, method, url, response.status_code)
            checked += 1
    assert checked >= 12


@pytest.mark.django_db
def test_a_viewer_gets_403_on_every_dashboard_decision(acme_world, carol):
    """Pass: Carol (viewer at Acme) gets 403 on every POST to an Acme object URL, and nothing
    changes state (no unwind, no resolved item)."""
    from recovery.models import RecoveryItem, Unwind

    client = Client()
    client.force_login(carol)
    unwinds, resolved = Unwind.objects.count(), RecoveryItem.objects.filter(status="resolved").count()
    checked = 0
    for route, name in dashboard_patterns():
        if "<" not in route or name in OWN_OBJECT_URLS:
            continue
        response = client.post(fill_route(route, acme_world), {"reason": "viewer tries"})
        if response.status_code == 405:
            continue
        assert response.status_code == 403, (name, response.status_code)
        checked += 1
    assert checked >= 9
    assert (Unwind.objects.count(), RecoveryItem.objects.filter(status="resolved").count()) == (
        unwinds,
        resolved,
    )


def _api_operations() -> list[tuple[str, str, dict[str, Any]]]:
    from saga_admin.api.app import api

    document = api.get_openapi_schema()
    return [
        (method, path, operation)
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    ]


def _api_path(path: str, world: dict[str, str]) -> str:
    filled = re.sub(
        r"\{(\w+)\}",
        lambda m: (
            world[m.group(1)]
            if m.group(1) in world
            else pytest.fail(f"{path}: no object for {{{m.group(1)}}}; add one to acme_world")
        ),
        path,
    )
    return filled.removeprefix("/api/v1")


@pytest.mark.django_db
def test_another_tenants_key_gets_404_on_every_api_operation_with_an_object(
    acme_world, outsider_key, other_tenant
):
    """Pass: Globex's keys (agent + operator, and an approver key for the approvals), on every
    operation of the OpenAPI document that names an Acme object, get exactly the answer a
    nonexistent id gets (404, or the same 422 when the body is checked first), so nothing tells
    them the object exists; GETs are 404; Acme's objects appear in none of the list operations."""

    outsider = Api(outsider_key[1])
    outsider_approver = Api(issue_key(other_tenant, "globex-approver", "approver")[1])
    missing = {name: f"{value[:4]}{'0' * 26}" for name, value in acme_world.items()}
    not_found = 0
    for method, path, _operation in _api_operations():

        def call(world: dict[str, str], path: str = path, method: str = method) -> Any:
            url = _api_path(path, world)
            # Approvers decide approvals; asking again is for agents and operators (request-again).
            deciding = url.startswith("/approvals") and not url.endswith("/request-again")
            client = outsider_approver if deciding else outsider
            return client.get(url) if method == "get" else client.post(url, {"reason": "x"})

        response = call(acme_world)
        if "{" in path:
            ghost = call(missing)
            assert (response.status_code, response.json()["error"]["code"]) == (
                ghost.status_code,
                ghost.json()["error"]["code"],
            ), (method, path, response.content[:200])
            assert response.status_code in (404, 422), (method, path, response.status_code)
            assert method != "get" or response.status_code == 404, path
            not_found += response.status_code == 404
        elif method == "get":
            assert response.status_code == 200, (path, response.status_code)
            assert not set(acme_world.values()) & set(
                re.findall(r"[a-z]{3}_[0-9a-z]{26}", response.content.decode())
            )
    assert not_found >= 15


@pytest.mark.django_db
def test_an_agent_only_key_gets_403_on_every_operator_operation(acme_world, agent_key):
    """Pass: a key without the operator scope (nor the approver's) gets 403 on every operation
    tagged recovery."""
    agent_only = Api(agent_key[1])
    checked = 0
    for method, path, operation in _api_operations():
        if "recovery" not in operation.get("tags", []):
            continue
        if path.endswith("/request-again"):
            continue  # an agent asks again for its own actions' approvals (tests/recovery/test_nothing_stuck.py)
        url = _api_path(path, acme_world)
        response = agent_only.get(url) if method == "get" else agent_only.post(url, {"reason": "x"})
        assert response.status_code == 403, (method, path, response.status_code)
        checked += 1
    assert checked >= 9


@pytest.mark.django_db
def test_an_operator_key_gets_403_on_every_approval_operation(acme_world, operator_key):
    """Pass: the operator scope does not decide approvals (only ``approver`` keys do)."""
    operator = Api(operator_key[1])
    checked = 0
    for method, path, _operation in _api_operations():
        if not path.startswith("/api/v1/approvals") or path.endswith("/request-again"):
            continue  # asking again is not deciding: operators ask again for steps (test_nothing_stuck)
        url = _api_path(path, acme_world)
        response = operator.get(url) if method == "get" else operator.post(url, {"reason": "x"})
        assert response.status_code == 403, (method, path, response.status_code)
        checked += 1
    assert checked == 3
    assert Approval.objects.get(pk=acme_world["approval_id"]).status == "pending"


@pytest.mark.django_db
def test_approval_decisions_need_the_approver_role(acme_world, alice):
    """Pass: an operator without the approver role gets 403 approving through the dashboard."""
    client = Client()
    client.force_login(alice)
    from django.urls import reverse

    response = client.post(
        reverse("dashboard:approval-approve", args=[acme_world["approval_id"]]), {"reason": "x"}
    )
    assert response.status_code == 403
    assert Approval.objects.get(pk=acme_world["approval_id"]).status == "pending"


@pytest.mark.django_db
def test_an_archived_runs_id_is_410_to_its_tenant_and_404_to_everyone_else_on_every_run_url(
    acme_world, alice, mallory, operator_key, outsider_key
):
    """Pass: on every dashboard URL and API operation that takes a run id, an archived Acme run is
    410 ``archived`` for Acme (Alice; its operator key on every API operation the operator scope
    may call) and, for Globex (Mallory; its agent + operator key), exactly the answer an id that
    never existed gets, without a word of the archive."""
    world = {**acme_world, "run_id": acme_world["archived_run_id"]}
    ghost = {**world, "run_id": f"{world['run_id'][:4]}{'0' * 26}"}
    acme, globex = Client(), Client()
    acme.force_login(alice)
    globex.force_login(mallory)
    checked = 0
    for route, name in dashboard_patterns():
        if "<run_id>" not in route and "<str:run_id>" not in route:
            continue
        for method in ("get", "post"):
            answer = getattr(acme, method)(fill_route(route, world), {"reason": "x"})
            if answer.status_code == 405:
                continue
            assert answer.status_code == 410, (name, method, answer.status_code)
            outsider = getattr(globex, method)(fill_route(route, world), {"reason": "x"})
            never = getattr(globex, method)(fill_route(route, ghost), {"reason": "x"})
            assert outsider.status_code == never.status_code == 404, (name, method)
            assert ARCHIVE_URL not in outsider.content.decode()
            checked += 1
    operator, outsider_api = Api(operator_key[1]), Api(outsider_key[1])
    for method, path, operation in _api_operations():
        if "{run_id}" not in path:
            continue
        url, never_url = _api_path(path, world), _api_path(path, ghost)
        body = {"reason": "x"}
        send = (lambda api, u: api.get(u)) if method == "get" else (lambda api, u: api.post(u, body))
        if method == "get" or "recovery" in operation.get("tags", []):
            answer = send(operator, url)
            assert answer.status_code == 410, (method, path, answer.content[:200])
            assert answer.json()["error"]["details"]["archive"] == ARCHIVE_URL
        outsider = send(outsider_api, url)
        never = send(outsider_api, never_url)
        assert (outsider.status_code, outsider.json()["error"]["code"]) == (
            never.status_code,
            never.json()["error"]["code"],
        ), (method, path, outsider.content[:200])
        assert outsider.status_code in (404, 422) and ARCHIVE_URL not in outsider.content.decode()
        checked += 1
    assert checked >= 18
