"""The residual risk of compensations built from what agents report:
``manage.py load_policies`` warns when a compensating tool that deletes or moves money is governed
by an ``approval: auto`` policy, and stays quiet once its policy asks a person."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from ledger.models import ToolPolicy
from ledger.policies.compensation_risks import destructive_words, unattended_destructive_compensations

pytestmark = pytest.mark.django_db


def _policy(tool: str, approval: str = "auto", action_class: str = "internal_update", **fields: Any):
    return {
        "tool": tool,
        "risk": "low",
        "approval": approval,
        "action_class": action_class,
        "compensation": "custom" if fields.get("compensation_tool") else "none",
        **fields,
    }


HR_FILE = {
    "policies": [
        _policy(
            "hr.create_user", compensation_tool="hr.delete_user", compensation_args={"email": "$args.email"}
        ),
        _policy("hr.delete_user"),
        _policy("crm.update_contact", compensation_tool="crm.restore_contact"),
        _policy("crm.restore_contact"),
    ],
    "compensators": {"hr.delete_user": {"python": "demo.compensators.delete_user"}},
}


def _load(tmp_path, data: dict[str, Any], *args: str) -> str:
    path = tmp_path / "policies.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    warnings = StringIO()
    call_command("load_policies", str(path), *args, stdout=StringIO(), stderr=warnings)
    return warnings.getvalue()


def test_load_policies_warns_about_an_unattended_compensation_that_deletes(tmp_path):
    out = _load(tmp_path, HR_FILE)
    warnings = [line for line in out.splitlines() if line.startswith("Warning:")]
    assert warnings == [
        "Warning: compensating tool hr.delete_user (named by hr.create_user, a registered compensator) "
        "deletes or moves money (its name says delete), and its policy (hr.delete_user) says approval: "
        "auto, so an unwind runs it without anyone approving the step. Its args come from what an "
        "agent reported: an agent could aim it (record a create for someone else's account, report "
        "success, fail). Set approval: manual on its policy."
    ]
    # The file loaded all the same: a warning, not an error.
    assert ToolPolicy.objects.filter(tenant=None).count() == 4
    # Asking a person for the step silences it; so does a load that changes nothing, which warns
    # again (the risk is still there).
    assert "Warning:" in _load(tmp_path, HR_FILE)
    fixed = {
        **HR_FILE,
        "policies": [*HR_FILE["policies"][:1], _policy("hr.delete_user", "manual"), *HR_FILE["policies"][2:]],
    }
    assert "Warning:" not in _load(tmp_path, fixed)


def test_a_tenant_policy_asking_a_person_overrides_the_global_one_for_that_tenant(tmp_path, tenant):
    _load(tmp_path, HR_FILE)
    out = _load(tmp_path, {"policies": [_policy("hr.delete_*", "manual")]}, "--tenant", tenant.slug)
    # The tenant's glob is less specific than the global exact name: the global auto still governs.
    assert "Warning: compensating tool hr.delete_user" in out
    out = _load(tmp_path, {"policies": [_policy("hr.delete_user", "manual")]}, "--tenant", tenant.slug)
    assert "Warning:" not in out
    assert [w.tool for w in unattended_destructive_compensations(tenant=None)] == ["hr.delete_user"]
    assert unattended_destructive_compensations(tenant=tenant) == []


def test_it_knows_money_and_deletion_by_name_or_by_an_irreversible_class(tmp_path):
    data = {
        "policies": [
            _policy(
                "payments.charge",
                "manual",
                "external_irreversible",
                compensation_tool="payments.refundCharge",
            ),
            _policy("payments.refundCharge", action_class="external_irreversible"),
            _policy(
                "email.send_*",
                action_class="external_irreversible",
                compensation_tool="email.send_correction",
            ),
            _policy("email.send_correction", action_class="external_irreversible"),
            _policy("ws.provision", compensation_tool="ws.cancel-license"),
            _policy("ws.cancel-license", "manual"),
            # Governed by the default policy, which this file makes automatic.
            _policy("bank.open", compensation_tool="bank.close_and_transfer"),
        ],
        "default_policy": {"approval": "auto", "action_class": "internal_update"},
    }
    _load(tmp_path, data)
    found = {w.tool: (w.policy, w.why) for w in unattended_destructive_compensations(tenant=None)}
    assert found == {
        "payments.refundCharge": (
            "payments.refundCharge",
            "deletes or moves money (its name says refund, charge)",
        ),
        "email.send_correction": (
            "email.send_correction",
            "cannot be undone in turn (its policy classes it external_irreversible)",
        ),
        "bank.close_and_transfer": ("*default*", "deletes or moves money (its name says transfer)"),
    }


def test_it_matches_whole_words_only():
    assert destructive_words("hr.delete_user") == ["delete"]
    assert destructive_words("billing.createTransfer") == ["transfer"]
    assert destructive_words("stripe/refund:payout") == ["refund", "payout"]
    for harmless in ("payments.restore", "crm.undelete_contact", "hr.update_payroll", "ws.cancellation_note"):
        assert destructive_words(harmless) == [], harmless


def test_a_policy_that_says_the_tool_can_be_undone_is_believed_whatever_its_name(tmp_path):
    data = {
        "policies": [
            _policy("ws.provision", compensation_tool="workspace.cancel_license"),
            # Its policy says a cancelled licence is provisioned again: not flagged for "cancel".
            _policy("workspace.cancel_license", action_class="external_reversible"),
            _policy("docs.draft", compensation_tool="docs.delete_draft"),
            _policy("docs.delete_draft", action_class="draft_only"),
            # Its policy leaves it open (an internal update): the name still counts.
            _policy("hr.create_user", compensation_tool="hr.delete_user"),
            _policy("hr.delete_user"),
        ],
    }
    _load(tmp_path, data)
    assert [w.tool for w in unattended_destructive_compensations(tenant=None)] == ["hr.delete_user"]


def test_an_alias_is_judged_by_what_it_calls_too(tmp_path):
    data = {
        "policies": [
            _policy("inventory.add_item", compensation_tool="inventory.undo_add"),
            _policy("inventory.undo_add"),
            _policy("crm.add_note", compensation_tool="crm.undo_note"),
            _policy("crm.undo_note"),
            _policy("billing.add_credit", compensation_tool="billing.undo_credit"),
            _policy("billing.undo_credit"),
        ],
        "compensators": {
            "inventory.undo_add": {"mcp": "http://127.0.0.1:9/mcp", "tool": "remove_item"},
            "crm.undo_note": {
                "webhook": "https://crm.internal/saga/purge_note",
                "secret_env": "CRM_SAGA_SECRET",
            },
            "billing.undo_credit": {"python": "billing.compensators.restore_balance"},
        },
    }
    _load(tmp_path, data)
    found = {w.tool: w.why for w in unattended_destructive_compensations(tenant=None)}
    assert found == {
        "inventory.undo_add": "deletes or moves money (it calls remove_item, whose name says remove)",
        "crm.undo_note": "deletes or moves money (it calls purge_note, whose name says purge)",
    }


def test_the_demo_policies_do_not_flag_the_licence_they_can_provision_again():
    from pathlib import Path

    demo = Path(__file__).resolve().parents[2] / "demo" / "policies" / "native.json"
    call_command("load_policies", str(demo), stdout=StringIO(), stderr=StringIO())
    flagged = {w.tool for w in unattended_destructive_compensations(tenant=None)}
    assert "workspace.cancel_license" not in flagged and "people.revoke_license" not in flagged
    assert "hr.delete_user" in flagged  # an automatic delete built from reported args is still named
