"""The agent observes an approval nobody decided before its policy's deadline as a rejection with
reason ``timed_out``: the Python client, blocked waiting for the decision against a live server,
raises ``ApprovalDeadlinePassed`` once a real worker's periodic sweep enforces a "1s" deadline
(escalated first, then rejected, when the policy says escalate)."""

from __future__ import annotations

import pytest
from saga_client import ApprovalDeadlinePassed, ApprovalRejected, Saga

from ledger.models import Action, Event, Run, ToolPolicy
from recovery.models import Approval

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture
def saga(live_server, agent_key, onboarding_policies):
    client = Saga(live_server.url, agent_key[1], poll_interval_s=0.1, max_poll_interval_s=0.2, backoff_s=0.01)
    yield client
    client.close()


def _charge(saga: Saga) -> tuple[str, ApprovalDeadlinePassed]:
    with (
        pytest.raises(ApprovalDeadlinePassed) as raised,
        saga.run(agent="onboarding", request="Charge") as run,
    ):
        run.step(
            "payments.charge",
            target=("customer", "c-9"),
            args={"customer": "c-9", "amount": 300, "currency": "EUR"},
            do=lambda: pytest.fail("a call nobody approved must not run"),
        )
    return run.id, raised.value


def test_the_client_raises_deadline_passed_when_the_worker_rejects_a_timed_out_approval(saga, start_worker):
    ToolPolicy.objects.filter(tenant=None, tool="payments.charge").update(approval_timeout_s=1)
    start_worker()
    run_id, rejected = _charge(saga)
    assert isinstance(rejected, ApprovalRejected) and rejected.code == "approval_deadline_passed"
    assert rejected.reason == "timed_out" and rejected.escalated_to == ""
    assert "nobody decided before its approval deadline" in str(rejected)
    action = Action.objects.get(run_id=run_id)
    approval = Approval.objects.get(action=action)
    assert (action.status, approval.status, approval.reason) == ("rejected", "expired", "timed_out")
    assert Event.objects.filter(subject_id=approval.pk, kind="approval.expired").count() == 1
    assert Run.objects.get(pk=run_id).status == "failed"


def test_an_escalated_approval_nobody_decided_either_reaches_the_client_the_same_way(saga, start_worker):
    ToolPolicy.objects.filter(tenant=None, tool="payments.charge").update(
        approval_timeout_s=1, on_timeout="escalate", escalate_to="admin"
    )
    start_worker()
    run_id, rejected = _charge(saga)
    assert rejected.reason == "timed_out" and rejected.escalated_to == "admin"
    assert "escalated to admin first" in str(rejected)
    approval = Approval.objects.get(action__run_id=run_id)
    assert approval.escalated_at is not None and approval.status == "expired"
    assert Event.objects.filter(subject_id=approval.pk, kind="approval.escalated").count() == 1
