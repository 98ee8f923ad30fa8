"""Where a compensator points (its webhook or MCP URL, its Python path) is the installation's
configuration: shown to the operators and admins of a tenant, not to its viewers (or approvers).
A viewer sees that a compensator exists and of which kind. A step's error, which everyone who may
read the run sees, names the compensator by its tool, never by its address."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from ledger.audit import Actor
from ledger.models import Compensator
from recovery import compensators
from recovery.actions.compensations import unwind_start
from recovery.compensators import CompensationRequest
from recovery.models import Unwind, UnwindStep
from tests.factories import HR_PATH, HR_SECRET, WS_PATH, WS_SECRET, load_onboarding_policies, onboarding_saga
from tests.support.processes import Reply, dump_worker_logs, serve_webhooks, wait_for

WEBHOOK_URL = "https://hr.internal.example/saga/delete_user"
MCP_URL = "https://mcp.internal.example:8443/mcp"
PYTHON_PATH = "internal_tools.workspace.cancel_license"


def _register() -> None:
    Compensator.objects.create(tool="hr.delete_user", kind="webhook", url=WEBHOOK_URL, secret_env="HR_SECRET")
    Compensator.objects.create(
        tool="crm.restore_contact", kind="mcp", url=MCP_URL, mcp_tool="restore_contact_v2"
    )
    Compensator.objects.create(tool="workspace.cancel_license", kind="python", python_path=PYTHON_PATH)


def _policies_page(user) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("dashboard:policies"))
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.django_db
def test_a_viewer_sees_that_compensators_exist_but_not_where_they_point(tenant, carol, bob, alice, dave):
    """Pass: the viewer's and the approver's policies page list each compensator's tool and kind,
    and no URL, host, remote tool or Python path; the operator's and the admin's show them."""
    _register()
    hidden = (
        WEBHOOK_URL,
        "hr.internal.example",
        MCP_URL,
        "mcp.internal.example",
        "restore_contact_v2",
        PYTHON_PATH,
    )
    for reader in (carol, bob):
        page = _policies_page(reader)
        for tool in ("hr.delete_user", "crm.restore_contact", "workspace.cancel_license"):
            assert f'data-compensator="{tool}"' in page, (reader.username, tool)
        assert "HTTP webhook" in page and "MCP tool" in page and "Python callable" in page
        for secret_place in hidden:
            assert secret_place not in page, (reader.username, secret_place)
    for reader in (alice, dave):
        page = _policies_page(reader)
        for place in (WEBHOOK_URL, MCP_URL, "restore_contact_v2", PYTHON_PATH):
            assert place in page, (reader.username, place)


def _request() -> CompensationRequest:
    return CompensationRequest(
        step_id="stp_1",
        action_id="act_1",
        run_id="run_1",
        tenant="acme",
        tool="hr.delete_user",
        args={"email": "ashu@company.com"},
        target_type="user",
        target_id="ashu@company.com",
        before_snapshot=None,
        after_snapshot=None,
        attempt=1,
        idempotency_key="stp_1",
        timeout_s=2.0,
    )


def test_a_webhook_compensators_errors_name_it_by_its_tool_not_its_address():
    """Pass: an answer that quotes the endpoint's own address, a refused connection and a time-out
    all give errors that name "the webhook compensator of hr.delete_user" and no host or port."""
    with serve_webhooks({HR_PATH: HR_SECRET}) as server:
        url = server.url(HR_PATH)
        address = url.split("//", 1)[1].split("/", 1)[0]
        server.script[HR_PATH] = [Reply(400, body={"error": f"POST {url} refused: unknown user"})]
        answered = compensators.webhook_call(url=url, secret=HR_SECRET, request=_request())
    refused = compensators.webhook_call(url=url, secret=HR_SECRET, request=_request())  # the server is gone
    for outcome in (answered, refused):
        assert "the webhook compensator of hr.delete_user" in outcome.error, outcome.error
        assert address not in outcome.error and "127.0.0.1" not in outcome.error, outcome.error
    assert "answered 400" in answered.error and "unknown user" in answered.error


@pytest.mark.django_db(transaction=True)
def test_a_viewer_reading_a_failed_unwind_sees_no_compensator_address(
    tenant, agent, alice, carol, own_redis, start_worker
):
    """Pass: a real worker runs an unwind whose compensator answers 400 quoting its own URL; the
    viewer's run page shows the failed step and its error, without the compensator's address."""
    with serve_webhooks({HR_PATH: HR_SECRET, WS_PATH: WS_SECRET}) as server:
        load_onboarding_policies(webhooks=server)
        saga = onboarding_saga(tenant, agent)
        server.script[WS_PATH] = [Reply(400, body={"error": f"{server.url(WS_PATH)} says: no such licence"})]
        worker = start_worker()
        unwind = unwind_start(item=saga.item, actor=Actor.for_user(alice), reason="hire withdrew")

        def finished() -> bool:
            unwind.refresh_from_db()
            return unwind.status in (Unwind.Status.COMPLETED, Unwind.Status.FAILED)

        try:
            wait_for(finished, timeout=60, what="the unwind to finish")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{dump_worker_logs([worker])}") from exc
        address = server.url(WS_PATH).split("//", 1)[1].split("/", 1)[0]

    step = unwind.steps.get(tool="workspace.cancel_license")
    assert step.status == UnwindStep.Status.FAILED and "no such licence" in step.error
    client = Client()
    client.force_login(carol)
    page = client.get(reverse("dashboard:run-detail", args=[saga.run.pk])).content.decode()
    assert "the webhook compensator of workspace.cancel_license answered 400" in page
    assert address not in page and "127.0.0.1" not in page
