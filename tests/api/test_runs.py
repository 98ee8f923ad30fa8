from __future__ import annotations

import json

import pytest

from ledger.audit import Actor
from ledger.models import Run
from ledger.services import runs
from recovery.actions import commands as recovery_commands
from recovery.models import RecoveryItem
from tests.factories import new_action, new_run
from tests.support.api import error_of

pytestmark = pytest.mark.django_db


def test_it_creates_a_run(api, agent_key, settings):
    # An internal name the operator allows (it need not resolve: allowed by name, not address).
    settings.SAGA = {**settings.SAGA, "OUTBOUND_ALLOWED_HOSTS": ["agent.internal"]}
    response = api.post(
        "/runs",
        {
            "agent": "onboarding",
            "request": "Onboard Ashu Kumar",
            "external_id": "T-17",
            "resume_url": "https://agent.internal/resume",
            "metadata": {"team": "people"},
        },
    )
    assert response.status_code == 201
    body = response.json()
    assert body["id"].startswith("run_") and body["status"] == "running"
    assert body["external_id"] == "T-17" and body["metadata"] == {"team": "people"}
    run = Run.objects.get(pk=body["id"])
    assert run.tenant == agent_key[0].tenant and run.created_by_key == agent_key[0]


def test_it_refuses_a_resume_url_that_is_not_http(api):
    response = api.post("/runs", {"agent": "a", "request": "r", "resume_url": "javascript:alert(1)"})
    assert response.status_code == 422
    assert error_of(response)["code"] == "url_not_allowed"
    assert not Run.objects.exists()


def test_it_shows_a_run_with_its_actions_checkpoint_item_and_warnings(api, onboarding_policies):
    run = new_run(api)
    email = new_action(api, run["id"], key="mail", tool="email.send_welcome", compensation=None)
    license_ = new_action(api, run["id"], key="lic", tool="workspace.provision_license", compensation=None)
    api.post(f"/runs/{run['id']}/checkpoints", {"name": "after-license", "state": {"step": 2}})
    api.post(f"/runs/{run['id']}/fail", {"error": "boom", "failed_action_id": license_["id"]})

    body = api.get(f"/runs/{run['id']}").json()
    assert [a["id"] for a in body["actions"]] == [email["id"], license_["id"]]
    assert body["latest_checkpoint"]["name"] == "after-license"
    assert body["recovery_item"]["reason"] == "failed"
    # A reversible step after the irreversible e-mail breaks the saga order.
    assert [w["code"] for w in body["warnings"]] == ["pivot_order"]
    assert body["warnings"][0]["action_id"] == license_["id"]


def test_it_pages_runs_newest_first_with_an_opaque_cursor(api):
    created = [new_run(api, external_id=f"job-{i}")["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = api.get("/runs", params).json()
        seen += [r["id"] for r in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(created))


def test_it_filters_runs_by_status_agent_and_external_id(api, agent):
    first = new_run(api, external_id="job-1")
    new_run(api, agent="billing", external_id="job-2")
    runs.run_complete(run=Run.objects.get(pk=first["id"]), actor=agent)

    assert [r["id"] for r in api.get("/runs", {"status": "succeeded"}).json()["items"]] == [first["id"]]
    assert [r["agent"] for r in api.get("/runs", {"agent": "billing"}).json()["items"]] == ["billing"]
    assert [r["external_id"] for r in api.get("/runs", {"external_id": "job-1"}).json()["items"]] == ["job-1"]
    assert api.get("/runs", {"status": "sleeping"}).status_code == 422


def test_it_refuses_a_forged_cursor(api):
    response = api.get("/runs", {"cursor": "not-a-cursor"})
    assert response.status_code == 422
    assert error_of(response)["details"] == {"cursor": "invalid"}


def test_it_lists_only_the_keys_tenant(api, outsider_api):
    new_run(api)
    assert outsider_api.get("/runs").json()["items"] == []


def test_heartbeat_returns_pending_commands_and_ack_removes_them(api, alice):
    run = new_run(api)
    command = recovery_commands.command_issue(
        run=Run.objects.get(pk=run["id"]),
        kind="resume",
        actor=Actor.for_user(alice),
        reason="fixed the mail gateway",
    )

    beat = api.post(f"/runs/{run['id']}/heartbeat", {"note": "still working"})
    assert beat.status_code == 200
    assert [c["id"] for c in beat.json()["commands"]] == [command.pk]
    assert beat.json()["commands"][0]["kind"] == "resume"
    assert api.get(f"/runs/{run['id']}/commands").json()["commands"][0]["reason"] == "fixed the mail gateway"

    acked = api.post(f"/commands/{command.pk}/ack")
    assert acked.status_code == 200 and acked.json()["status"] == "acked"
    # Agents retry: a second ack is harmless.
    assert api.post(f"/commands/{command.pk}/ack").status_code == 200
    assert api.post(f"/runs/{run['id']}/heartbeat").json()["commands"] == []
    assert Run.objects.get(pk=run["id"]).last_heartbeat_at is not None


def test_another_tenants_command_is_not_found(api, outsider_api, alice):
    run = new_run(api)
    command = recovery_commands.command_issue(
        run=Run.objects.get(pk=run["id"]),
        kind="cancel",
        actor=Actor.for_user(alice),
        reason="user withdrew the request",
    )
    response = outsider_api.post(f"/commands/{command.pk}/ack")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"


def test_it_completes_a_run_once(api):
    run = new_run(api)
    response = api.post(f"/runs/{run['id']}/complete", {"summary": "Ashu is onboarded."})
    assert response.status_code == 200
    assert response.json()["status"] == "succeeded" and response.json()["summary"] == "Ashu is onboarded."

    again = api.post(f"/runs/{run['id']}/complete")
    assert again.status_code == 409
    error = error_of(again)
    assert error["code"] == "invalid_transition" and error["details"]["current"] == "succeeded"


def test_failing_a_run_puts_it_in_the_recovery_queue(api, onboarding_policies):
    run = new_run(api)
    action = new_action(api, run["id"])
    response = api.post(
        f"/runs/{run['id']}/fail", {"error": "mail gateway 429", "failed_action_id": action["id"]}
    )
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "failed" and body["failed_action_id"] == action["id"]
    item = RecoveryItem.objects.get(run_id=run["id"])
    assert body["recovery_item"]["id"] == item.pk
    assert item.reason == "failed" and item.failed_action_id == action["id"]


def test_failing_with_another_tenants_action_is_not_found(api, outsider_api, onboarding_policies):
    theirs = new_run(outsider_api)
    their_action = new_action(outsider_api, theirs["id"])
    run = new_run(api)
    response = api.post(f"/runs/{run['id']}/fail", {"error": "x", "failed_action_id": their_action["id"]})
    assert response.status_code == 404


@pytest.mark.parametrize("status_change", ["cancel", "close"])
def test_a_cancelled_or_closed_run_refuses_new_actions(api, agent, status_change, onboarding_policies):
    run = new_run(api)
    model = Run.objects.get(pk=run["id"])
    if status_change == "cancel":
        runs.run_cancel(run=model, actor=agent, reason="user withdrew the request")
    else:
        runs.run_fail(run=model, actor=agent, error="x")
        runs.run_close(run=model, actor=agent, reason="nothing to undo")
    response = api.post(
        f"/runs/{run['id']}/actions", {"tool": "hr.create_user", "idempotency_key": "late-job"}
    )
    assert response.status_code == 409
    assert error_of(response)["code"] == "run_not_accepting_actions"


def test_policies_lists_what_applies_to_the_tenant(api, tenant, other_tenant, onboarding_policies):
    from ledger.models import ToolPolicy

    ToolPolicy.objects.create(
        tenant=tenant,
        tool="hr.create_user",
        risk="low",
        approval="auto",
        action_class="internal_update",
        source="acme.json",
    )
    ToolPolicy.objects.create(
        tenant=other_tenant,
        tool="globex.secret_tool",
        risk="low",
        approval="auto",
        action_class="read_only",
        source="globex.json",
    )
    body = api.get("/policies").json()
    tools = {(p["tool"], p["scope"]) for p in body["policies"]}
    assert ("hr.create_user", "tenant") in tools and ("hr.create_user", "global") not in tools
    assert ("crm.update_*", "global") in tools
    assert not any(p["tool"] == "globex.secret_tool" for p in body["policies"])
    assert body["default_policy"]["approval"] == "manual" and body["default_policy"]["risk"] == "high"
    assert body["unwind"]["on_compensation_failure"] == "alert_and_continue"


def test_commands_are_pushed_to_the_resume_url_signed_for_the_receiver(api, alice, settings, monkeypatch):
    import httpx
    from saga_client import verify_signature

    from infra import outbound
    from ledger import resume_secrets
    from recovery.notifications.command_push import deliver_command

    settings.SAGA = {
        **settings.SAGA,
        "RESUME_WEBHOOK_SECRET": "master-secret",
        "OUTBOUND_ALLOWED_HOSTS": ["agent.internal"],
    }
    run = new_run(api, resume_url="https://agent.internal/saga/commands")
    command = recovery_commands.command_issue(
        run=Run.objects.get(pk=run["id"]), kind="resume", actor=Actor.for_user(alice), reason="gateway fixed"
    )
    received = []

    def fake_post(target, *, content, headers, timeout):
        received.append((target.url, content, headers))
        return httpx.Response(200, request=httpx.Request("POST", target.url))

    monkeypatch.setattr(outbound, "post", fake_post)
    assert deliver_command(command_id=command.pk)

    [(url, content, headers)] = received
    assert url == "https://agent.internal/saga/commands"
    # Signed with the agent's own secret (manage.py resume_secret), not the master.
    agent_secret = resume_secrets.resume_secret(Run.objects.get(pk=run["id"]).tenant, "onboarding-agent")
    assert verify_signature(agent_secret, headers, content, url="https://agent.internal/saga/commands")
    assert not verify_signature("master-secret", headers, content)
    assert headers["Idempotency-Key"] == command.pk
    assert json.loads(content)["kind"] == "resume"


def test_the_policies_answer_carries_an_etag_that_moves_with_any_load(api, tenant):
    """The clients keep their copy of the policies current with If-None-Match: the same ETag is a
    304 with no body, and any policy written (here, a reader's) moves it."""
    from ledger.models import StateReader

    first = api.get("/policies")
    etag = first["ETag"]
    assert first.status_code == 200 and etag.startswith('"policies-')
    again = api.get("/policies", headers={"If-None-Match": etag})
    assert (again.status_code, again.content, again["ETag"]) == (304, b"", etag)
    StateReader.objects.create(tool="crm.get_contact", kind="python", python_path="x.y")
    moved = api.get("/policies", headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved["ETag"] != etag
    assert moved.json()["policies"] == first.json()["policies"]
