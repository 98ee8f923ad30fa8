"""What the Python client makes of an operator's cancel and of an approval nobody decides, against
a real server: typed errors (``RunCancelled``, ``ApprovalTimedOut``), and no second report of a
failure the server can no longer take."""

from __future__ import annotations

import logging

import pytest
from saga_client import ApprovalTimedOut, Conflict, RunCancelled

from ledger.audit import Actor
from ledger.models import Run
from recovery.actions.cancellations import run_cancel

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "ashu@company.com"


def test_an_operators_cancel_surfaces_as_run_cancelled_and_is_not_reported_as_a_failure(saga, alice, caplog):
    caplog.set_level(logging.DEBUG, logger="saga_client")
    created: list[str] = []
    with (
        pytest.raises(RunCancelled) as raised,
        saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run,
    ):
        run.step(
            "hr.create_user",
            target=("user", EMAIL),
            args={"email": EMAIL},
            do=lambda: created.append(EMAIL),
            compensate=("hr.delete_user", {"email": EMAIL}),
        )
        run_cancel(run=Run.objects.get(pk=run.id), actor=Actor.for_user(alice), reason="withdrew")
        run.step("email.send_welcome", target=("user", EMAIL), args={"to": EMAIL}, do=lambda: None)

    error = raised.value
    # Still a Conflict with the API's own code, for code that caught those before.
    assert isinstance(error, Conflict) and error.code == "run_not_accepting_actions"
    assert error.details["current"] == "cancelled" and error.run_id == run.id
    assert created == [EMAIL]
    assert Run.objects.get(pk=run.id).status == "cancelled"
    # The client did not try to fail the cancelled run: no 409 invalid_transition, no traceback.
    client_records = [r for r in caplog.records if r.name.startswith("saga_client")]
    assert not [r for r in client_records if r.levelno >= logging.WARNING], caplog.text
    assert "could not report" not in caplog.text
    # The server saw the refused step, and no attempt to fail the run after it.
    refused = [r.getMessage() for r in caplog.records if r.name == "django.request"]
    assert refused == [f"Conflict: /api/v1/runs/{run.id}/actions"], refused


def test_an_approval_nobody_decides_times_out_with_the_reason(saga):
    with (
        pytest.raises(ApprovalTimedOut) as raised,
        saga.run(agent="onboarding", request="Pay the invoice") as run,
    ):
        run.step(
            "payments.charge",
            target=("invoice", "NW-1"),
            args={"amount": 10},
            do=lambda: None,
            approval_timeout_s=0.2,
        )
    assert raised.value.code == "approval_timeout"
    assert "nobody decided" in raised.value.reason
    assert Run.objects.get(pk=run.id).status == "failed"
