"""The operator API through the whole URL stack: auth, scopes, tenant isolation, strict bodies,
and the decisions (compensate, resume, close, approvals)."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from ledger.audit import Actor
from ledger.models import Event, Run
from ledger.services import runs
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.models import Approval, RecoveryItem, Unwind
from recovery.unwinds.advance import unwind_advance_move
from tests.factories import load_onboarding_policies, onboarding_saga


@pytest.fixture
def api(operator_key):
    client = Client()
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {operator_key[1]}"
    return client


@pytest.fixture
def saga(tenant, agent):
    load_onboarding_policies()
    return onboarding_saga(tenant, agent)


def _post(client, path, body):
    return client.post(f"/api/v1{path}", body, content_type="application/json")


def test_it_requires_a_key_the_operator_scope_and_the_right_tenant(saga, agent_key, outsider_key):
    anonymous = Client()
    response = anonymous.get("/api/v1/recovery")
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"

    agent_only = Client(HTTP_AUTHORIZATION=f"Bearer {agent_key[1]}")
    response = agent_only.get("/api/v1/recovery")
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"

    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {outsider_key[1]}")
    assert outsider.get(f"/api/v1/recovery/{saga.item.pk}").status_code == 404
    assert _post(outsider, f"/recovery/{saga.item.pk}/close", {"reason": "mine now"}).status_code == 404
    assert outsider.get("/api/v1/recovery").json()["items"] == []
    assert RecoveryItem.objects.get(pk=saga.item.pk).status == RecoveryItem.Status.OPEN


def test_the_queue_lists_newest_first_with_filters_and_cursor_pagination(api, tenant, agent, saga):
    from ledger.services import runs

    more = []
    for n in range(3):
        run = runs.run_create(tenant=tenant, actor=agent, agent="a", request=f"r{n}")
        more.append(run_fail_and_queue(run=run, actor=agent, error="boom").item)

    page = api.get("/api/v1/recovery", {"limit": 2}).json()
    assert [i["id"] for i in page["items"]] == [more[2].pk, more[1].pk]
    rest = api.get("/api/v1/recovery", {"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [i["id"] for i in rest["items"]] == [more[0].pk, saga.item.pk] and rest["next_cursor"] is None

    # The age is the whole seconds since the item opened, as of the request.
    opened = timezone.now() - timedelta(minutes=5)
    RecoveryItem.objects.filter(pk=saga.item.pk).update(opened_at=opened)
    before = timezone.now()
    only_saga = api.get("/api/v1/recovery", {"run": saga.run.pk}).json()["items"]
    after = timezone.now()
    assert [i["id"] for i in only_saga] == [saga.item.pk]
    first = only_saga[0]
    assert first["risk"] == "medium" and first["failed_action"]["tool"] == "email.send_welcome"
    # The welcome e-mail failed retryably: resuming is the suggestion.
    assert first["suggested_resolution"] == "resume"
    assert int((before - opened).total_seconds()) <= first["age_s"] <= int((after - opened).total_seconds())
    assert api.get("/api/v1/recovery", {"risk": "critical"}).json()["items"] == []
    assert len(api.get("/api/v1/recovery", {"older_than": 0}).json()["items"]) == 4
    assert api.get("/api/v1/recovery", {"older_than": 60}).json()["items"] == []
    assert api.get("/api/v1/recovery", {"reason": "nonsense"}).status_code == 422
    # Found by schemathesis: a huge age overflowed the date arithmetic into a 500.
    huge = api.get("/api/v1/recovery", {"older_than": 4385971160033})
    assert huge.status_code == 422 and huge.json()["error"]["code"] == "invalid_request"


def test_the_item_shows_its_compensation_plan(api, saga):
    body = api.get(f"/api/v1/recovery/{saga.item.pk}").json()
    assert [s["tool"] for s in body["plan"]["steps"]] == ["workspace.cancel_license", "hr.delete_user"]
    assert body["resume_preview"]["run_id"] == saga.run.pk


def test_compensate_returns_202_with_the_unwind_and_a_second_request_gets_409(api, saga):
    response = _post(api, f"/recovery/{saga.item.pk}/compensate", {"reason": "new hire withdrew"})
    assert response.status_code == 202, response.content
    unwind = response.json()
    assert [s["tool"] for s in unwind["steps"]] == ["workspace.cancel_license", "hr.delete_user"]
    assert {s["status"] for s in unwind["steps"]} == {"pending"}

    again = _post(api, f"/recovery/{saga.item.pk}/compensate", {"reason": "double click"})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "invalid_transition"
    assert again.json()["error"]["details"]["current"] == "claimed"

    polled = api.get(f"/api/v1/unwinds/{unwind['id']}").json()
    assert polled["status"] == "running" and polled["run_id"] == saga.run.pk
    event = Event.objects.get(kind="unwind.started", run=saga.run)
    assert event.actor_type == "agent_key" and event.reason == "new hire withdrew"


@pytest.mark.parametrize(
    "body",
    [{}, {"reason": ""}, {"reason": 42}, {"reason": "ok", "reasn": "typo"}],
    ids=["missing", "empty", "not-a-string", "unknown-field"],
)
def test_decisions_need_a_reason_in_a_strict_body(api, saga, body):
    response = _post(api, f"/recovery/{saga.item.pk}/close", body)
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_request"
    assert RecoveryItem.objects.get(pk=saga.item.pk).status == RecoveryItem.Status.OPEN


def test_resume_issues_a_command_and_close_resolves(api, tenant, agent, saga):
    response = _post(api, f"/recovery/{saga.item.pk}/resume", {"reason": "gateway is back"})
    assert response.status_code == 202, response.content
    assert response.json()["kind"] == "resume" and response.json()["status"] == "pending"
    assert Run.objects.get(pk=saga.run.pk).status == Run.Status.RUNNING
    assert _post(api, f"/recovery/{saga.item.pk}/close", {"reason": "late"}).status_code == 409

    run = runs.run_create(tenant=tenant, actor=agent, agent="a", request="r")
    item = run_fail_and_queue(run=run, actor=agent, error="boom").item
    closed = _post(api, f"/recovery/{item.pk}/close", {"reason": "duplicate request"})
    assert closed.status_code == 200 and closed.json()["resolution"] == "closed"


def test_approvals_are_for_approver_keys_only(api, tenant, agent, alice, approver_key):
    """The operator key (recovery automation) neither lists nor decides approvals: 403 naming the
    approver scope, and the approval stays pending."""
    load_onboarding_policies(license_risk="high")
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    approval = Approval.objects.get(step__unwind=unwind)
    for response in (
        api.get("/api/v1/approvals"),
        _post(api, f"/approvals/{approval.pk}/approve", {"reason": "ok"}),
        _post(api, f"/approvals/{approval.pk}/reject", {"reason": "no"}),
    ):
        assert response.status_code == 403
        assert response.json()["error"]["details"] == {"scope": "approver"}
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING


def test_approvals_can_be_listed_approved_and_rejected(approver_key, tenant, agent, alice):
    api = Client(HTTP_AUTHORIZATION=f"Bearer {approver_key[1]}")
    load_onboarding_policies(license_risk="high")
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="undo")
    unwind_advance_move(unwind_id=unwind.pk)
    approval = Approval.objects.get(step__unwind=unwind)

    inbox = api.get("/api/v1/approvals").json()["items"]
    assert [(a["id"], a["kind"], a["tool"]) for a in inbox] == [
        (approval.pk, "compensation", "workspace.cancel_license")
    ]
    stale = _post(api, f"/approvals/{approval.pk}/approve", {"reason": "ok", "args_hash": "0" * 64})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "approval_args_changed"
    approved = _post(
        api,
        f"/approvals/{approval.pk}/approve",
        {"reason": "ok", "args_hash": approval.args_hash, "args": {"email": "ashu@company.com"}},
    )
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    assert Unwind.objects.get(pk=unwind.pk).status == Unwind.Status.RUNNING
    again = _post(api, f"/approvals/{approval.pk}/reject", {"reason": "changed my mind"})
    assert again.status_code == 409


def test_the_openapi_document_declares_the_operator_endpoints_and_their_errors(api):
    schema = Client().get("/api/v1/openapi.json").json()
    compensate = schema["paths"]["/api/v1/recovery/{item_id}/compensate"]["post"]
    assert {"202", "401", "403", "404", "409", "422"} <= set(compensate["responses"])
    assert "/api/v1/approvals/{approval_id}/approve" in schema["paths"]


@pytest.mark.parametrize("path", ["/api/v1/recovery", "/api/v1/approvals"])
def test_a_forged_or_oversized_cursor_is_a_422_not_a_500(operator_key, approver_key, path):
    key = approver_key if "approvals" in path else operator_key
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key[1]}")
    nested = base64.urlsafe_b64encode(b"[" * 200).decode()  # within the length, not one of ours
    response = api.get(path, {"cursor": nested})
    assert response.status_code == 422
    assert response.json()["error"]["details"] == {"cursor": "invalid"}
    oversized = base64.urlsafe_b64encode(b"[" * 5000).decode()  # json's stack would overflow
    response = api.get(path, {"cursor": oversized})
    assert response.status_code == 422 and response.json()["error"]["code"] == "invalid_request"
