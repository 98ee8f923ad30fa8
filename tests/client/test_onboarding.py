"""The seed scenario, written the way an agent author would: create the HR user, provision a
workspace license, send the welcome e-mail — each with its compensation registered."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from saga_client import ApprovalRejected, ApprovalTimeout, Conflict

from ledger.audit import Actor
from ledger.models import Action, Compensator, Run, ToolPolicy
from recovery.actions import commands as recovery_commands
from recovery.actions.approvals import approval_approve, approval_reject
from recovery.models import Approval, RecoveryItem

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL = "ashu@company.com"


class World:
    """The systems the agent changes, in memory."""

    def __init__(self, *, mail_fails_with: BaseException | None = None) -> None:
        self.users: dict[str, dict] = {}
        self.licenses: dict[str, str] = {}
        self.outbox: list[str] = []
        self.mail_fails_with = mail_fails_with
        self.calls = 0

    def create_user(self, args: dict) -> dict:
        self.calls += 1
        self.users[args["email"]] = {"name": args["name"], "active": True}
        return {"user_id": len(self.users)}

    def provision_license(self, args: dict) -> dict:
        self.calls += 1
        self.licenses[args["email"]] = args["sku"]
        return {"license": f"lic-{args['sku']}"}

    def send_welcome(self) -> dict:
        self.calls += 1
        if self.mail_fails_with is not None:
            raise self.mail_fails_with
        self.outbox.append(EMAIL)
        return {"message_id": "m-1"}


def onboard(saga, world: World) -> str:
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar", external_id="HR-17") as run:
        run.step(
            "hr.create_user",
            target=("user", EMAIL),
            args={"email": EMAIL, "name": "Ashu Kumar"},
            do=world.create_user,
            compensate=("hr.delete_user", {"email": EMAIL}),
            after=lambda result: {"user_id": result["user_id"], "active": True},
        )
        run.step(
            "workspace.provision_license",
            target=("user", EMAIL),
            args={"email": EMAIL, "sku": "business-standard"},
            do=world.provision_license,
            compensate=("workspace.cancel_license", {"email": EMAIL}),
        )
        run.checkpoint("accounts-ready", state={"email": EMAIL}, summary="Ashu has an account and a license.")
        run.step(
            "email.send_welcome",
            target=("user", EMAIL),
            args={"to": EMAIL, "template": "welcome"},
            do=world.send_welcome,
            intent={"reasoning": "HR asked for a welcome mail", "confidence": 0.9},
        )
        return run.id


def test_the_success_path_records_every_step_and_completes_the_run(saga):
    world = World()
    run_id = onboard(saga, world)

    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded" and run.external_id == "HR-17"
    actions = list(run.actions.order_by("seq"))
    assert [(a.tool, a.status) for a in actions] == [
        ("hr.create_user", "succeeded"),
        ("workspace.provision_license", "succeeded"),
        ("email.send_welcome", "succeeded"),
    ]
    assert actions[0].result == {"user_id": 1} and actions[0].after_snapshot == {"user_id": 1, "active": True}
    assert (actions[0].compensation_tool, actions[0].compensation_args) == (
        "hr.delete_user",
        {"email": EMAIL},
    )
    assert actions[1].compensation_tool == "workspace.cancel_license"
    assert run.checkpoints.get().completed_action_ids == [actions[0].pk, actions[1].pk]
    assert world.outbox == [EMAIL]
    assert saga.trail(run_id)["summary"].endswith("The full audit record is linked below.")


def test_a_failure_at_step_three_lands_the_run_in_the_recovery_queue(saga):
    world = World(mail_fails_with=RuntimeError("mail gateway 429"))
    with pytest.raises(RuntimeError, match="mail gateway 429"):
        onboard(saga, world)

    run = Run.objects.get(external_id="HR-17")
    assert run.status == "failed"
    email_action = Action.objects.get(run=run, tool="email.send_welcome")
    assert email_action.status == "failed" and "mail gateway 429" in email_action.error
    item = RecoveryItem.objects.get(run=run)
    assert item.status == "open" and item.reason == "failed"
    assert item.failed_action_id == email_action.pk
    # The first two steps stand, each with its compensation: an operator can undo them.
    assert list(
        run.actions.filter(status="succeeded").values_list("compensation_tool", flat=True).order_by("seq")
    ) == ["hr.delete_user", "workspace.cancel_license"]


def test_a_timeout_at_step_three_is_an_unknown_outcome_to_reconcile(saga):
    world = World(mail_fails_with=TimeoutError("SMTP read timed out"))
    with pytest.raises(TimeoutError):
        onboard(saga, world)
    run = Run.objects.get(external_id="HR-17")
    assert Action.objects.get(run=run, tool="email.send_welcome").status == "unknown"
    item = RecoveryItem.objects.get(run=run)
    assert item.reason == "outcome_unknown" and item.suggested_resolution == "reconcile"


def test_retrying_a_step_reuses_its_key_and_does_not_act_twice(saga):
    world = World()
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        args = {"email": EMAIL, "name": "Ashu Kumar"}
        first = run.step("hr.create_user", target=("user", EMAIL), args=args, do=world.create_user)
        again = run.step("hr.create_user", target=("user", EMAIL), args=args, do=world.create_user)
    assert first == again == {"user_id": 1}
    assert world.calls == 1
    assert Action.objects.filter(run_id=run.id).count() == 1


def test_a_failed_step_retried_in_the_block_runs_again_under_the_same_key(saga):
    attempts = []

    def flaky(args: dict) -> dict:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("HR API reset the connection")
        return {"user_id": 7}

    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        with pytest.raises(ConnectionError):
            run.step("hr.create_user", target=("user", EMAIL), args={"email": EMAIL}, do=flaky)
        assert run.step("hr.create_user", target=("user", EMAIL), args={"email": EMAIL}, do=flaky) == {
            "user_id": 7
        }
    action = Action.objects.get(run_id=run.id)
    assert action.status == "succeeded" and action.attempts == 2
    assert Run.objects.get(pk=run.id).status == "succeeded"


def _approve_when_asked(decide, *, timeout_s: float = 10.0) -> threading.Thread:
    """An approver in another thread: waits for the pending approval, then decides."""

    def approver() -> None:
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                approval = Approval.objects.filter(status="pending").first()
                if approval is not None:
                    decide(approval)
                    return
                time.sleep(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=approver)
    thread.start()
    return thread


def test_an_approval_gated_step_waits_and_proceeds_with_the_approved_args(saga, bob):
    # The refund the agent names as its compensation must be a registered compensator (it is
    # never called here: nothing is undone).
    Compensator.objects.create(
        tool="payments.refund", kind="python", python_path="payments_service.saga.refund"
    )
    charged: list[dict] = []
    approver = _approve_when_asked(
        lambda approval: approval_approve(
            approval=approval,
            actor=Actor.for_user(bob),
            reason="first month only",
            args={"amount": 30, "currency": "EUR"},
        )
    )
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        result = run.step(
            "payments.charge",
            target=("customer", "c-9"),
            args={"amount": 300, "currency": "EUR"},
            do=lambda args: charged.append(args) or {"charge_id": "ch_1"},
            compensate=("payments.refund", {"charge_id": "ch_1"}),
        )
    approver.join()
    assert result == {"charge_id": "ch_1"}
    assert charged == [{"amount": 30, "currency": "EUR"}]
    action = Action.objects.get(run_id=run.id)
    assert action.status == "succeeded" and action.args == {"amount": 30, "currency": "EUR"}


def test_a_rejected_step_raises_and_fails_the_run(saga, bob):
    approver = _approve_when_asked(
        lambda approval: approval_reject(
            approval=approval, actor=Actor.for_user(bob), reason="not for a new hire"
        )
    )
    with (
        pytest.raises(ApprovalRejected, match="not for a new hire"),
        saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run,
    ):
        run.step("payments.charge", args={"amount": 300}, do=lambda: pytest.fail("must not run"))
    approver.join()
    assert Run.objects.get(pk=run.id).status == "failed"
    assert RecoveryItem.objects.get(run_id=run.id).failed_action.tool == "payments.charge"


def test_an_approval_that_never_comes_times_out(saga):
    with pytest.raises(ApprovalTimeout), saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        run.step(
            "payments.charge",
            args={"amount": 300},
            do=lambda: pytest.fail("must not run"),
            approval_timeout_s=0.3,
        )
    # The block raised, so the run failed, and the approval it gave up on is withdrawn with it:
    # nobody is left to approve a step of a run that is over.
    assert Run.objects.get(pk=run.id).status == "failed"
    action = Action.objects.get(run_id=run.id)
    assert action.status == "rejected"
    assert action.approvals.get().reason.startswith("withdrawn: the run failed")


def test_a_run_left_with_a_recorded_step_awaiting_approval_is_parked_not_completed(saga):
    with saga.run(agent="onboarding", request="Refund order 7") as run:
        recorded = run.record("payments.charge", args={"amount": 300})
        assert recorded["status"] == "awaiting_approval"
    # The clean exit could not complete it (409 pending_approvals): it stays running, for the
    # approval, as a step that raised ApprovalPending leaves it.
    assert Run.objects.get(pk=run.id).status == "running"
    assert Action.objects.get(pk=recorded["id"]).approvals.get().status == "pending"

    with pytest.raises(Conflict) as refused:
        run.complete("all done")
    assert refused.value.code == "pending_approvals" and recorded["id"] in str(refused.value)
    completed = run.complete("all done", withdraw_approvals=True)
    assert completed["status"] == "succeeded"
    assert Action.objects.get(pk=recorded["id"]).status == "rejected"


def test_an_unknown_tool_is_gated_by_the_default_policy_and_the_client_says_so_once(saga, caplog):
    assert not ToolPolicy.objects.filter(tool="db.drop_table").exists()
    with caplog.at_level("WARNING", logger="saga_client"):
        with pytest.raises(ApprovalTimeout), saga.run(agent="ops", request="Clean up") as run:
            run.step("db.drop_table", args={"table": "users"}, do=lambda: None, approval_timeout_s=0.2)
        with saga.run(agent="ops", request="Clean up again") as again:
            again.record("db.drop_table", args={"table": "orders"})
            again.complete("left for later", withdraw_approvals=True)
    said = [r.getMessage() for r in caplog.records if "No policy names db.drop_table" in r.getMessage()]
    assert said == [
        "saga: No policy names db.drop_table; the default applied (risk high, approval manual). "
        "Check the tool's name, or add a policy for it."
    ]


def test_heartbeat_returns_commands_and_ack_clears_them(saga, alice):
    with saga.run(agent="onboarding", request="Onboard Ashu Kumar") as run:
        assert run.heartbeat() == []
        recovery_commands.command_issue(
            run=Run.objects.get(pk=run.id),
            kind="cancel",
            actor=Actor.for_user(alice),
            reason="the hire withdrew",
        )
        commands = run.heartbeat("halfway")
        assert [c["kind"] for c in commands] == ["cancel"]
        run.ack(commands[0]["id"])
        assert run.commands() == []


def test_the_client_records_with_start_and_reads_every_action_of_a_long_run(saga):
    run = saga.create_run(agent="onboarding", request="Onboard 120 people")
    recorded = [
        saga.record_action(
            run["id"],
            tool="hr.create_user",
            idempotency_key=f"{run['id']}:{i}",
            target_id=f"u{i}@company.com",
            args={"email": f"u{i}@company.com", "name": f"User {i}"},
            start=True,
        )
        for i in range(120)
    ]
    assert {(a["status"], a["attempts"]) for a in recorded} == {("running", 1)}
    detail = saga.get_run(run["id"])
    assert [a["id"] for a in detail["actions"]] == [a["id"] for a in recorded[-100:]]
    assert detail["actions_next"] == f"/api/v1/runs/{run['id']}/actions"
    assert [a["id"] for a in saga.list_actions(run["id"], page_size=50)] == [a["id"] for a in recorded]
