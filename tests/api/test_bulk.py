"""Bulk decisions by filter over a live server and real worker processes: preview, execute,
progress, items that changed after the start skipped, abort, and every refusal an attacker can
provoke (an empty filter, a changed count, wrong types, huge strings, another tenant's bulk)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ledger.audit import Actor
from ledger.models import Event
from recovery.actions.resolutions import item_close
from recovery.bulk.models import BulkItem, BulkOperation
from recovery.models import RecoveryItem, Unwind, UnwindStep
from tests.factories import auto_policy
from tests.recovery.bulk_support import crm_policies, failing_runs
from tests.support.processes import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

FILTER = {"tool": "crm.update_*"}


class Operator:
    """The operator key's client against the live server."""

    def __init__(self, url: str, secret: str) -> None:
        self.client = httpx.Client(
            base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=30
        )

    def preview(self, filter: Any = FILTER, action: str = "close", **extra: Any) -> httpx.Response:
        return self.client.post(
            "/recovery/bulk",
            json={"filter": filter, "action": action, "reason": "upstream broke", "preview": True, **extra},
        )

    def start(self, count: Any, filter: Any = FILTER, action: str = "close", **extra: Any) -> httpx.Response:
        body = {
            "filter": filter,
            "action": action,
            "reason": "upstream broke",
            "expected_count": count,
            **extra,
        }
        return self.client.post("/recovery/bulk", json=body)

    def get(self, bulk_id: str) -> dict[str, Any]:
        response = self.client.get(f"/recovery/bulk/{bulk_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def wait_settled(self, bulk_id: str, timeout: float = 60) -> dict[str, Any]:
        return wait_for(
            lambda: (body := self.get(bulk_id))["status"] != "running" and body,
            timeout=timeout,
            what=f"bulk {bulk_id} to settle",
        )


@pytest.fixture
def operator(live_server, operator_key) -> Operator:
    return Operator(live_server.url, operator_key[1])


@pytest.fixture
def outsider(live_server, outsider_key) -> Operator:
    return Operator(live_server.url, outsider_key[1])


def _error(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def test_it_previews_executes_and_reports_progress(operator, tenant, agent, operator_key, start_worker):
    crm_policies()
    matching = failing_runs(tenant, agent, 12)
    others = failing_runs(tenant, agent, 2, tool="crm.delete_contact")

    preview = operator.preview()
    assert preview.status_code == 200, preview.text
    body = preview.json()
    assert body["count"] == 12
    assert body["by_risk"] == {"low": 12}
    assert body["by_reason"] == {"failed": 12}
    assert len(body["sample"]) == 10
    assert {s["failed_action"]["tool"] for s in body["sample"]} == {"crm.update_contact"}
    assert body["needs_approval"] == 0
    assert not BulkOperation.objects.exists()  # a preview changes nothing

    started = operator.start(12)
    assert started.status_code == 202, started.text
    bulk_id = started.json()["id"]
    assert started.json() == {"id": bulk_id, "status": "running", "total": 12}
    assert bulk_id.startswith("blk_")

    start_worker()
    done = operator.wait_settled(bulk_id)
    assert (done["status"], done["done"], done["failed"], done["skipped"]) == ("finished", 12, 0, 0)
    assert done["requested_by"] == "supervisor" and done["errors"] == [] and done["finished_at"]
    assert set(
        RecoveryItem.objects.filter(pk__in=[i.pk for i in matching]).values_list("resolution", flat=True)
    ) == {"closed"}
    assert RecoveryItem.objects.filter(pk__in=[i.pk for i in others], status="open").count() == 2
    # Each decision is the requesting key's, and names the bulk.
    closes = Event.objects.filter(kind="recovery.resolved", run_id__in=[i.run_id for i in matching])
    assert closes.count() == 12
    assert {(e.actor_label, e.data.get("bulk_id")) for e in closes} == {("supervisor", bulk_id)}
    assert Event.objects.filter(kind="run.closed", data__bulk_id=bulk_id).count() == 12
    assert Event.objects.filter(kind="bulk.finished", subject_id=bulk_id).count() == 1
    # Decided: the same filter now matches nothing, so the old count is refused.
    assert _error(operator.start(12))["code"] == "count_changed"


def test_it_skips_items_that_changed_after_the_start(operator, tenant, agent, alice, start_worker):
    crm_policies()
    items = failing_runs(tenant, agent, 4)
    bulk_id = operator.start(4).json()["id"]
    # Before any worker picks the bulk up, a person closes one of its items themselves.
    item_close(item=items[1], actor=Actor.for_user(alice), reason="handled by hand")

    start_worker()
    done = operator.wait_settled(bulk_id)
    assert (done["status"], done["done"], done["skipped"], done["failed"]) == ("finished", 3, 1, 0)
    skipped = BulkItem.objects.get(bulk_id=bulk_id, outcome="skipped")
    assert skipped.item_id == items[1].pk and "resolved" in skipped.message
    # The person's decision stands; the bulk did not decide it again.
    assert RecoveryItem.objects.get(pk=items[1].pk).resolved_by == alice
    assert not Event.objects.filter(run_id=items[1].run_id, data__bulk_id=bulk_id).exists()


def test_it_aborts_before_anything_more_starts(operator, tenant, agent, start_worker):
    crm_policies()
    failing_runs(tenant, agent, 3)
    bulk_id = operator.start(3).json()["id"]

    aborted = operator.client.post(f"/recovery/bulk/{bulk_id}/abort", json={"reason": "wrong filter"})
    assert aborted.status_code == 200, aborted.text
    assert (aborted.json()["status"], aborted.json()["abort_reason"]) == ("aborted", "wrong filter")
    again = operator.client.post(f"/recovery/bulk/{bulk_id}/abort", json={"reason": "again"})
    assert again.status_code == 409 and _error(again)["code"] == "invalid_transition"

    start_worker()
    # The job runs and starts nothing: wait until it has been taken off the queue and finished.
    wait_for(lambda: _job_gone(BulkOperation.objects.get(pk=bulk_id).job_id), what="the bulk's job to run")
    body = operator.get(bulk_id)
    assert (body["status"], body["done"], body["failed"], body["skipped"]) == ("aborted", 0, 0, 0)
    assert RecoveryItem.objects.filter(status="open").count() == 3


def _job_gone(job_id: str) -> bool:
    from recovery import queueing

    return queueing.job_state(job_id) in ("finished", "missing")


def test_a_finished_bulk_cannot_be_aborted(operator, tenant, agent, start_worker):
    crm_policies()
    failing_runs(tenant, agent, 2)
    bulk_id = operator.start(2).json()["id"]
    start_worker()
    assert operator.wait_settled(bulk_id)["status"] == "finished"
    refused = operator.client.post(f"/recovery/bulk/{bulk_id}/abort", json={"reason": "too late"})
    assert refused.status_code == 409 and _error(refused)["code"] == "invalid_transition"
    assert operator.get(bulk_id)["status"] == "finished"


def test_a_bulk_compensation_still_waits_for_approvers(operator, tenant, agent, start_worker):
    """A compensation whose undo needs an approver is started by the bulk and waits for one: the
    bulk decides, a person still grants."""
    crm_policies()
    auto_policy("crm.restore", approval="manual", compensation="none")
    items = failing_runs(tenant, agent, 3, undoable=True)
    preview = operator.preview(action="compensate").json()
    assert (preview["count"], preview["needs_approval"]) == (3, 3)

    bulk_id = operator.start(3, action="compensate").json()["id"]
    start_worker()
    done = operator.wait_settled(bulk_id)
    assert (done["done"], done["failed"]) == (3, 0)
    unwinds = Unwind.objects.filter(run_id__in=[i.run_id for i in items])
    assert unwinds.count() == 3
    wait_for(
        lambda: UnwindStep.objects.filter(unwind__in=unwinds, status="awaiting_approval").count() == 3,
        what="every step to wait for an approver",
    )
    assert Event.objects.filter(kind="run.compensating", data__bulk_id=bulk_id).count() == 3


def test_it_refuses_an_empty_filter_and_a_changed_count(operator, tenant, agent):
    crm_policies()
    failing_runs(tenant, agent, 2)
    for empty in ({}, {"status": "unresolved"}, {"status": "all"}, {"status": "open"}, {"q": "   "}):
        for response in (operator.preview(filter=empty), operator.start(2, filter=empty)):
            assert response.status_code == 422, response.text
            assert _error(response)["code"] == "filter_required"
    changed = operator.start(5)
    assert changed.status_code == 409
    error = _error(changed)
    assert error["code"] == "count_changed" and error["details"]["count"] == 2
    missing = operator.client.post(
        "/recovery/bulk", json={"filter": FILTER, "action": "close", "reason": "x"}
    )
    assert missing.status_code == 422 and "expected_count" in missing.text
    assert not BulkOperation.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"filter": FILTER, "action": "delete", "reason": "x", "expected_count": 1},
        {"filter": FILTER, "action": "close", "reason": "x", "expected_count": "1"},
        {"filter": FILTER, "action": "close", "reason": "x", "expected_count": 1.5},
        {"filter": FILTER, "action": "close", "reason": "x", "expected_count": -1},
        {"filter": FILTER, "action": "close", "reason": "x", "expected_count": True},
        {"filter": FILTER, "action": "close", "reason": "x", "preview": "yes"},
        {"filter": "crm.update_*", "action": "close", "reason": "x", "preview": True},
        {"filter": {"tool": ["crm.*"]}, "action": "close", "reason": "x", "preview": True},
        {"filter": {"colour": "red"}, "action": "close", "reason": "x", "preview": True},
        {"filter": {"tool": "crm update; drop table"}, "action": "close", "reason": "x", "preview": True},
        {"filter": {"tool": "c" * 300}, "action": "close", "reason": "x", "preview": True},
        {"filter": {"q": "q" * 100_000}, "action": "close", "reason": "x", "preview": True},
        {"filter": {"agent": "a" * 5000}, "action": "close", "reason": "x", "preview": True},
        {"filter": {"risk": "apocalyptic"}, "action": "close", "reason": "x", "preview": True},
        {"filter": {"older_than": 10**12}, "action": "close", "reason": "x", "preview": True},
        {"filter": FILTER, "action": "close", "reason": "", "expected_count": 1},
        {"filter": FILTER, "action": "close", "reason": "r" * 100_000, "expected_count": 1},
        {"filter": FILTER, "action": "close", "reason": "x", "expected_count": 10**12},
        [1, 2, 3],
    ],
)
def test_it_refuses_hostile_bodies_with_422(operator, tenant, agent, body):
    response = operator.client.post("/recovery/bulk", json=body)
    assert response.status_code in (400, 413, 422), response.text
    _error(response)
    assert not BulkOperation.objects.exists()


def test_another_tenants_bulk_is_not_found(operator, outsider, tenant, agent):
    crm_policies()
    failing_runs(tenant, agent, 1)
    bulk_id = operator.start(1).json()["id"]
    for response in (
        outsider.client.get(f"/recovery/bulk/{bulk_id}"),
        outsider.client.post(f"/recovery/bulk/{bulk_id}/abort", json={"reason": "mine now"}),
        operator.client.get("/recovery/bulk/blk_00000000000000000000000000"),
        operator.client.get("/recovery/bulk/" + "x" * 200),
        operator.client.post("/recovery/bulk/nonsense/abort", json={"reason": "x"}),
    ):
        assert response.status_code == 404, response.text
        assert _error(response)["code"] == "not_found"
    # The outsider's own filter never reaches Acme's items.
    assert outsider.preview().json()["count"] == 0
    assert BulkOperation.objects.get(pk=bulk_id).status == "running"


def test_the_agent_scope_cannot_decide_in_bulk(live_server, agent_key, tenant, agent):
    client = Operator(live_server.url, agent_key[1])
    assert client.preview().status_code == 403


def test_the_queue_filters_by_agent_tool_and_q(operator, tenant, agent):
    crm_policies()
    crm = failing_runs(tenant, agent, 2, agent_name="crm-sync")
    failing_runs(tenant, agent, 1, tool="crm.delete_contact", agent_name="cleaner")

    def ids(**query: Any) -> set[str]:
        response = operator.client.get("/recovery", params=query)
        assert response.status_code == 200, response.text
        return {item["id"] for item in response.json()["items"]}

    assert ids(agent="crm-sync") == {i.pk for i in crm}
    assert len(ids(agent="onboarding-agent")) == 3  # the owning key's name
    assert ids(tool="crm.update_contact") == {i.pk for i in crm}
    assert len(ids(tool="crm.*")) == 3
    assert ids(tool="crm.update_*", agent="cleaner") == set()
    assert ids(q=crm[0].run_id) == {crm[0].pk}
    for hostile in ({"tool": "a b"}, {"tool": "x" * 300}, {"agent": "a" * 300}, {"q": "q" * 600}):
        response = operator.client.get("/recovery", params=hostile)
        assert response.status_code == 422, (hostile, response.text)
