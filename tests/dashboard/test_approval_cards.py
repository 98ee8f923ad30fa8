"""An approval card says what approving will do. A compensation's card names the compensating
tool and the args that will run, the policy that governs it, the target's state as the forward
action left it, a predicted change only where one can be computed (a snapshot restore) and plain
words otherwise, and who decided the compensation — never the forward action's before-state or
reasoning passed off as the compensation's. A forward action's card is what it always was."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.urls import reverse

from ledger.audit import Actor
from ledger.models import Compensator, ToolPolicy
from ledger.services import runs
from ledger.services.actions import moves
from recovery.actions.approvals import action_record_gated, approval_approve
from recovery.actions.compensations import unwind_start
from recovery.actions.reports import run_fail_and_queue
from recovery.models import Approval
from recovery.unwinds.advance import unwind_advance_move
from tests.factories import gated_run, load_onboarding_policies, onboarding_saga

pytestmark = pytest.mark.django_db

INBOX = reverse("dashboard:approvals")


def _card(body: str, approval: Approval) -> str:
    """The text of one card, tags stripped and entities decoded, whitespace collapsed."""
    found = re.search(rf'<article [^>]*id="approval-{approval.pk}".*?</article>', body, re.S)
    assert found, f"no card for {approval.pk}"
    return _text(found.group(0))


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _card_html(body: str, approval: Approval) -> str:
    found = re.search(rf'<article [^>]*id="approval-{approval.pk}".*?</article>', body, re.S)
    assert found
    return found.group(0)


def _inbox(client, user) -> str:
    client.force_login(user)
    response = client.get(INBOX)
    assert response.status_code == 200
    return response.content.decode()


def _step_approval(unwind) -> Approval:
    unwind_advance_move(unwind_id=unwind.pk)
    return Approval.objects.get(step__unwind=unwind, status=Approval.Status.PENDING)


# --- A forward action: unchanged -----------------------------------------------------------------


def test_a_forward_action_card_shows_the_action_the_agent_asks_for(client, tenant, agent, bob):
    _run, action, approval = gated_run(tenant, agent)
    card = _card(_inbox(client, bob), approval)
    for text in (
        "payments.refund → on order:order-7",
        "Forward action",
        "by agent key onboarding-agent",
        "Policy payments.refund (global policy) · high risk · manual approval",
        "Agent’s reasoning (confidence 91%): Customer was double charged.",
        "Arguments {",
        '"amount": 40',
        "Before (current state as recorded) {",
        '"refunded": 0',
    ):
        assert text in card, text
    for text in ("What approving runs", "Predicted change", "Compensation decided by", "Current state"):
        assert text not in card, text


def test_a_forward_action_without_a_before_state_says_so(client, tenant, agent, bob):
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="billing", request="Charge INV-1")
    action = action_record_gated(
        run=run, actor=agent, tool="payments.charge", idempotency_key="c-1", args={"amount_cents": 100}
    ).action
    card = _card(_inbox(client, bob), action.approvals.get())
    assert "Before (current state as recorded) Not recorded: the agent sent no before-state" in card
    assert "Agent’s reasoning" not in card  # it gave none; nothing is made up


# --- A snapshot restore: the diff from the after-state to what the restore writes -----------------


def test_a_snapshot_restore_predicts_the_change_from_the_after_state(client, tenant, agent, bob, carol):
    load_onboarding_policies()
    # Undoing a high-risk action always waits for a person, even when the restore's policy is auto.
    ToolPolicy.objects.filter(tool="crm.update_*").update(risk="high")
    Compensator.objects.create(
        tool="crm.update_contact_0.restore", kind="webhook", url="http://127.0.0.1:9/r"
    )
    saga = onboarding_saga(tenant, agent, extra_actions=1)
    update = saga.run.actions.get(tool="crm.update_contact_0")
    unwind = unwind_start(item=saga.item, actor=Actor.for_user(carol), reason="Undo the CRM change")
    approval = _step_approval(unwind)
    assert approval.tool == "crm.update_contact_0.restore"

    body = _inbox(client, bob)
    card = _card(body, approval)
    forward = f"#{update.seq} crm.update_contact_0"
    for text in (
        "Compensation step",
        "asked",
        "by carol",
        f"Runs crm.update_contact_0.restore to restore user:contact-0 to the state recorded before {forward}."
        " Served by a webhook compensator.",
        "Compensation decided by carol (operator) — “Undo the CRM change”",
        "Step 1 of 3.",
        "Policy that governs it crm.update_* (global policy) · high risk · auto approval",
        "Why a person approves it It undoes a high-risk action, and undoing a high or critical one always does.",
        f"Arguments it will run with (the state to restore, recorded before {forward}) {{",
        f"Built from the before-state recorded by {forward}.",
        f"Current state (as recorded after {forward}) {{",
        f"Predicted change Field by field, from user:contact-0 as {forward} left it to the state the "
        "restore writes.",
        f"The agent’s reasoning for {forward} (the action being undone, not this compensation)",
    ):
        assert text in card, text
    assert "Before (current state as recorded)" not in card
    # The table goes from the after-state ({"owner": 0}) to the restored one ({"owner": "nobody"}).
    table = re.search(r'<table class="diff">.*?</table>', _card_html(body, approval), re.S)
    assert table is not None
    rows = {_text(r).split(" ")[0]: _text(r) for r in re.findall(r"<tr class.*?</tr>", table.group(0), re.S)}
    assert rows["owner"] == 'owner 0 "nobody" changed'
    assert rows["stage"] == 'stage "lead" "lead" unchanged'
    assert "Now" in _text(table.group(0)) and "After the restore" in _text(table.group(0))
    assert "removed" not in _text(table.group(0))


# --- A custom undo: no table, what is known said plainly ---------------------------------------------


def test_a_custom_undo_says_what_is_known_and_what_the_compensator_gets(client, tenant, agent, bob, carol):
    load_onboarding_policies()
    ToolPolicy.objects.filter(tool="hr.delete_user").update(approval="manual")
    saga = onboarding_saga(tenant, agent)
    unwind = unwind_start(
        item=saga.item,
        actor=Actor.for_user(carol),
        reason="HR cancelled the hire",
        action_ids=[saga.create_user.pk],
    )
    approval = _step_approval(unwind)

    body = _inbox(client, bob)
    card = _card(body, approval)
    forward = f"#{saga.create_user.seq} hr.create_user"
    assert forward == "#1 hr.create_user"
    for text in (
        f"Runs hr.delete_user to undo {forward} on user:ashu@company.com.",
        "Compensation decided by carol (operator) — “HR cancelled the hire”",
        "Step 1 of 1 of a partial compensation (only the chosen actions are undone).",
        "Policy that governs it hr.delete_user (global policy) · low risk · manual approval",
        "Why a person approves it The compensating tool’s policy asks for a person (manual approval).",
        # Nothing serves hr.delete_user in this setup: the card warns before anyone approves.
        "Warning No compensator is registered for hr.delete_user: the step will fail.",
        'Arguments it will run with { "email": "ashu@company.com" } As the agent gave them with '
        f"{forward}’s compensation.",
        f'Current state (as recorded after {forward}) {{ "email": "ashu@company.com", "status": "active" }}',
        f"hr.delete_user undoes what {forward} did to user:ashu@company.com. {forward} recorded no "
        f"before-state: what user:ashu@company.com was before it is not known here (nothing, if {forward} "
        "created it). No prediction of the change: the compensator decides what it does. It is given:",
        "Arguments the arguments shown",
        "Target user:ashu@company.com",
        f"After-state of {forward} the current state shown",
        f"Before-state of {forward} none recorded",
        f"Idempotency key {approval.step.idempotency_key} (the same on every attempt)",
        f"The agent’s reasoning for {forward} (the action being undone, not this compensation) "
        "(confidence 87%): The HR ticket asks for an account first.",
    ):
        assert text in card, text
    assert '<table class="diff"' not in _card_html(body, approval)
    assert "Before (current state as recorded)" not in card


# --- A correction of a critical charge: the refund ---------------------------------------------------


def _charged_and_compensating(tenant, agent, bob, carol, *, invoice: str = "INV-7781") -> Approval:
    """A critical payments.charge (approved by bob) succeeded, its run failed, and carol decided to
    compensate it: the refund correction waits in the inbox."""
    load_onboarding_policies()
    ToolPolicy.objects.filter(tool="payments.charge").update(compensation_tool="payments.refund_charge")
    ToolPolicy.objects.update_or_create(
        tenant=None,
        tool="payments.refund_charge",
        defaults={
            "risk": "critical",
            "approval": "manual",
            "action_class": "external_irreversible",
            "compensation": "none",
        },
    )
    Compensator.objects.update_or_create(
        tenant=None,
        tool="payments.refund_charge",
        defaults={"kind": "webhook", "url": "http://127.0.0.1:9/refund", "secret": "s"},
    )
    run = runs.run_create(tenant=tenant, actor=agent, agent="billing-agent", request=f"Bill {invoice}")
    recorded = action_record_gated(
        run=run,
        actor=agent,
        tool="payments.charge",
        idempotency_key=f"charge-{invoice}",
        target_type="invoice",
        target_id=invoice,
        args={"customer": "Hooli", "amount_cents": 119_900, "currency": "USD"},
        intent={"reasoning": "Bill the corrected amount, then refund the duplicate.", "confidence": 0.8},
    ).action
    forward_approval = recorded.approvals.get()
    approval_approve(approval=forward_approval, actor=Actor.for_user(bob), reason="matches the PO")
    recorded.refresh_from_db()
    moves.action_start(action=recorded, actor=agent)
    moves.action_succeed(
        action=recorded,
        actor=agent,
        result={"payment_id": f"pay_{invoice}"},
        after_snapshot={"payment_id": f"pay_{invoice}", "amount_cents": 119_900, "status": "succeeded"},
    )
    outcome = run_fail_and_queue(run=run, actor=agent, error="duplicate charge")
    assert outcome.item is not None and outcome.unwind is None
    unwind = unwind_start(
        item=outcome.item, actor=Actor.for_user(carol), reason="The customer was charged twice"
    )
    return _step_approval(unwind)


def test_a_correction_of_a_critical_charge_never_shows_a_removal_table(client, tenant, agent, bob, carol):
    approval = _charged_and_compensating(tenant, agent, bob, carol)
    # No template in the policy: the refund is sent the charge's own args (filled at plan time).
    assert approval.tool == "payments.refund_charge"
    assert approval.args == {"customer": "Hooli", "amount_cents": 119_900, "currency": "USD"}

    body = _inbox(client, bob)
    card = _card(body, approval)
    for text in (
        "payments.refund_charge → on invoice:INV-7781",
        "Critical",
        "Runs payments.refund_charge to correct #1 payments.charge on invoice:INV-7781. #1 payments.charge "
        "cannot be undone: a correcting action is issued and the original effect stays visible. Served by "
        "a webhook compensator.",
        "Undoes #1 payments.charge (external, irreversible).",
        "Compensation decided by carol (operator) — “The customer was charged twice”",
        "Policy that governs it payments.refund_charge (global policy) · critical risk · manual approval",
        "Why a person approves it The compensating tool’s policy asks for a person (manual approval); it "
        "undoes a critical-risk action, and undoing a high or critical one always does.",
        'Arguments it will run with { "amount_cents": 119900, "currency": "USD", "customer": "Hooli" } '
        "Filled when planned from #1 payments.charge’s own arguments (the approved ones, if an approver "
        "edited them).",
        'Current state (as recorded after #1 payments.charge) { "amount_cents": 119900, '
        '"payment_id": "pay_INV-7781", "status": "succeeded" }',
        "Predicted change A correction restores nothing: #1 payments.charge’s effect stays, and "
        "payments.refund_charge acts on top of it. No prediction of the change: the compensator decides "
        "what it does. It is given:",
        "Arguments the arguments shown",
        "Target invoice:INV-7781",
        "Before-state of #1 payments.charge none recorded",
        "The agent’s reasoning for #1 payments.charge (the action being undone, not this compensation) "
        "(confidence 80%): Bill the corrected amount, then refund the duplicate.",
    ):
        assert text in card, text
    # What the issue saw: the forward action's empty before-state as "current", a table of every
    # payment field removed, and the charge's reasoning as if it were the refund's.
    assert "Before (current state as recorded)" not in card
    assert '<table class="diff"' not in _card_html(body, approval)
    assert "removed" not in card.lower()
    assert "Agent’s reasoning" not in card


def test_the_decided_card_still_says_what_the_compensation_does(client, tenant, agent, bob, carol, dave):
    approval = _charged_and_compensating(tenant, agent, bob, carol)
    client.force_login(dave)
    response = client.post(
        reverse("dashboard:approval-approve", args=[approval.pk]),
        {
            f"{approval.pk}-reason": "Refund confirmed with finance",
            f"{approval.pk}-shown_args_hash": approval.args_hash,
            f"{approval.pk}-args": json.dumps(approval.args),
        },
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200, response.content
    card = _text(response.content.decode())
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED
    assert "Approved by dave — “Refund confirmed with finance”" in card
    assert "Current state (as recorded after #1 payments.charge)" in card
    assert "Compensation decided by carol (operator)" in card
    assert "Before (current state as recorded)" not in card


# --- An automatic compensation: the rationale is the policy's, not a person's -------------------------


def test_an_automatic_compensation_says_no_person_decided_it(client, tenant, agent, bob):
    load_onboarding_policies(auto_compensate="medium")
    ToolPolicy.objects.filter(tool="workspace.cancel_license").update(approval="manual")
    saga = onboarding_saga(tenant, agent, fail_run=False)
    outcome = run_fail_and_queue(run=saga.run, actor=agent, error="mail gateway down")
    assert outcome.unwind is not None and outcome.unwind.automatic
    approval = _step_approval(outcome.unwind)

    card = _card(_inbox(client, bob), approval)
    assert "by automatic compensation" in card
    assert (
        "Compensation decided by Automatic compensation: no person decided it — “auto-compensation: every "
        "action and compensating tool is at or under medium risk”"
    ) in card
    assert (
        "Runs workspace.cancel_license to undo #2 workspace.provision_license on user:ashu@company.com."
        in card
    )
    # Both snapshots recorded: the card says what the tool is to do, and still predicts no table.
    assert (
        "workspace.cancel_license is to bring user:ashu@company.com back from the state #2 "
        "workspace.provision_license left to the one recorded before it."
    ) in card
    assert 'Before-state of #2 workspace.provision_license { "license": null }' in card


# --- Cost ----------------------------------------------------------------------------------------------


def test_compensation_cards_cost_no_query_per_card(
    client, tenant, agent, bob, carol, django_assert_max_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _charged_and_compensating(tenant, agent, bob, carol, invoice="INV-1")
    client.force_login(bob)
    client.get(INBOX)
    with CaptureQueriesContext(connection) as baseline:
        client.get(INBOX)
    for n in range(2, 5):
        _charged_and_compensating(tenant, agent, bob, carol, invoice=f"INV-{n}")
    gated_run(tenant, agent)
    with django_assert_max_num_queries(len(baseline.captured_queries)):
        body = client.get(INBOX).content.decode()
    assert _text(body).count("Compensation decided by carol") == 4
