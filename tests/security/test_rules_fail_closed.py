"""Rules fail closed on types, over the whole URL stack with real keys.

The agent is hostile and the tool behind a call may be lenient: it may read ``"5000"`` as 5000 or
``["gbp"]`` as ``"gbp"``. So where a rule compares a value that is present but of another kind
than the comparison needs, a rule that tightens the policy applies and one that relaxes it does
not; a deny is not escaped by wrapping a value in a list. The table at the end sends every
hostile kind to every operator, each as a tightening, a relaxing and a denying rule.

Personas: the onboarding agent (``agent_key``), the approval bot (``approver_key``).
"""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import Action, Event
from tests.factories import load_policy_file, new_run
from tests.support.api import Api, error_of


def _policy(tool: str, *, risk: str, approval: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "tool": tool,
        "risk": risk,
        "approval": approval,
        "action_class": "external_irreversible",
        "compensation": "none",
        "rules": rules,
    }


def _record(api: Api, run_id: str, key: str, tool: str, args: dict[str, Any], **fields: Any):
    return api.post(f"/runs/{run_id}/actions", {"tool": tool, "args": args, "idempotency_key": key, **fields})


@pytest.fixture
def agent(db, agent_key) -> Api:
    return Api(agent_key[1])


def test_a_numeric_string_against_a_tightening_rule_waits_for_a_person(agent, approver_key):
    load_policy_file(
        {
            "policies": [
                _policy(
                    "payments.charge",
                    risk="medium",
                    approval="auto",
                    rules=[{"if": {"arg": "amount", "gt": 1000}, "then": {"approval": "manual"}}],
                )
            ]
        }
    )
    run = new_run(agent)
    response = _record(agent, run["id"], "str-5000", "payments.charge", {"amount": "5000"}, start=True)
    assert response.status_code == 201, response.content
    action = response.json()
    # Asked to start at once, it waits instead: a person must decide first.
    assert (action["status"], action["requires_approval"]) == ("awaiting_approval", True)
    assert action["approval"]["status"] == "pending"
    assert action["policy"]["rule"] == {
        "index": 0,
        "description": "amount > 1,000 → manual approval",
        "then": {"approval": "manual"},
        "undecided": ["amount"],
    }
    started = agent.post(f"/actions/{action['id']}/start")
    assert (started.status_code, error_of(started)["code"]) == (409, "approval_pending")
    recorded = Event.objects.get(subject_id=action["id"], kind="action.recorded")
    assert recorded.data["rule"]["undecided"] == ["amount"]
    # The person decides; then, and only then, it runs.
    approver = Api(approver_key[1])
    granted = approver.post(
        f"/approvals/{action['approval']['id']}/approve", {"reason": "5000 USD, invoiced"}
    )
    assert granted.status_code == 200, granted.content
    assert agent.post(f"/actions/{action['id']}/start").status_code == 200
    # A real small number is still unattended, as the policy says.
    small = _record(agent, run["id"], "num-50", "payments.charge", {"amount": 50}, start=True).json()
    assert (small["status"], small["policy"]["rule"]) == ("running", None)


def test_a_relaxing_rule_does_not_match_a_numeric_string_nor_a_wrapped_country(agent):
    load_policy_file(
        {
            "policies": [
                _policy(
                    "payments.charge",
                    risk="high",
                    approval="manual",
                    rules=[{"if": {"arg": "amount", "lt": 100}, "then": {"risk": "low", "approval": "auto"}}],
                ),
                # A relaxation by negation: anywhere but the sanctioned countries runs unattended.
                _policy(
                    "payments.payout",
                    risk="high",
                    approval="manual",
                    rules=[
                        {
                            "if": {"arg": "country", "not_in": ["KP", "IR"]},
                            "then": {"risk": "low", "approval": "auto"},
                        }
                    ],
                ),
            ]
        }
    )
    run = new_run(agent)
    small = _record(agent, run["id"], "num-50", "payments.charge", {"amount": 50}).json()
    assert (small["status"], small["risk"], small["policy"]["rule"]["index"]) == ("planned", "low", 0)
    for key, amount in (("str", "50"), ("list", [50]), ("bool", True), ("null", None), ("obj", {"v": 50})):
        body = _record(agent, run["id"], key, "payments.charge", {"amount": amount}).json()
        assert (body["status"], body["risk"], body["requires_approval"]) == (
            "awaiting_approval",
            "high",
            True,
        ), amount
        # The relaxation did not apply, so no rule did.
        assert body["policy"]["rule"] is None, amount
    france = _record(agent, run["id"], "fr", "payments.payout", {"country": "FR"}).json()
    assert (france["status"], france["risk"]) == ("planned", "low")
    for key, country in (
        ("kp-list", ["KP"]),
        ("kp-object", {"code": "KP"}),
        ("kp-number", 408),
        ("null", None),
    ):
        body = _record(agent, run["id"], f"payout-{key}", "payments.payout", {"country": country}).json()
        assert (body["status"], body["risk"], body["policy"]["rule"]) == (
            "awaiting_approval",
            "high",
            None,
        ), country


def test_a_deny_on_not_in_is_not_escaped_by_a_list_or_an_object(agent):
    load_policy_file(
        {
            "policies": [
                _policy(
                    "payments.charge",
                    risk="medium",
                    approval="auto",
                    rules=[{"if": {"arg": "currency", "not_in": ["usd", "eur"]}, "then": {"effect": "deny"}}],
                )
            ]
        }
    )
    run = new_run(agent)
    for key, currency in (
        ("list-gbp", ["gbp"]),
        ("list-usd", ["usd"]),
        ("object", {"x": 1}),
        ("object-usd", {"currency": "usd"}),
        ("number", 840),
        ("bool", True),
        ("null", None),
    ):
        response = _record(agent, run["id"], key, "payments.charge", {"currency": currency, "amount": 5})
        assert response.status_code == 403, (currency, response.content)
        error = error_of(response)
        assert error["code"] == "policy_denied"
        assert error["details"] == {
            "policy": "payments.charge",
            "rule": 0,
            "description": 'currency is not one of "usd", "eur" → refused',
            "undecided": ["currency"],
        }
        assert "fail closed on types" in error["message"]
    # Nor by a list of objects that hold the allowed value.
    nested = _record(agent, run["id"], "nested", "payments.charge", {"currency": [{"code": "usd"}]})
    assert nested.status_code == 403
    assert not Action.objects.exists()
    assert _record(agent, run["id"], "usd", "payments.charge", {"currency": "usd"}).status_code == 201


# --- The table: every operator, every hostile kind, three ways ------------------------------------

# Every operator once: (operator, operand, the kind of value the comparison needs). The same table
# with every operand kind, against generated JSON values, is
# ``ledger/test_policy_rules_fail_closed.py::test_no_type_buys_a_relaxation``.
CONDITIONS: list[tuple[str, Any, str]] = [
    ("gt", 1000, "number"),
    ("gte", 1000, "number"),
    ("lt", 100, "number"),
    ("lte", 100, "number"),
    ("eq", "usd", "string"),
    ("ne", True, "boolean"),
    ("in", ["usd", "eur"], "string"),
    ("not_in", [1, 2], "number"),
    ("matches", "us*", "string"),
]

# Per kind needed: values of other kinds shaped to pass for it, then two of the kind itself (one
# that matches the condition above, one that does not, whichever the operator).
HOSTILE: dict[str, list[Any]] = {
    "number": ["5000", "50", [5000], {"v": 50}, True, None],
    "string": [["usd"], {"v": "usd"}, 1, False, None, ["gbp"]],
    "boolean": ["true", 1, [True], {"v": False}, None, "false"],
}
TYPED: dict[str, list[Any]] = {"number": [5000, 50, 1], "string": ["usd", "gbp"], "boolean": [True, False]}


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "other"


def test_no_type_buys_a_relaxation_over_http(agent):
    """Each condition as three policies: tightening (auto → critical + manual), relaxing (manual →
    low + auto) and denying. A value of another kind than the comparison needs gets the tightening
    rule, never the relaxation, and the deny; a value of the right kind gets exactly what the
    first matching rule says (so this is not met by gating everything)."""
    policies = []
    for n, (op, operand, _) in enumerate(CONDITIONS):
        condition = {"arg": "v", op: operand}
        policies += [
            _policy(
                f"t{n}.tightens",
                risk="low",
                approval="auto",
                rules=[{"if": condition, "then": {"risk": "critical", "approval": "manual"}}],
            ),
            _policy(
                f"t{n}.relaxes",
                risk="high",
                approval="manual",
                rules=[{"if": condition, "then": {"risk": "low", "approval": "auto"}}],
            ),
            _policy(
                f"t{n}.denies",
                risk="low",
                approval="auto",
                rules=[{"if": condition, "then": {"effect": "deny"}}],
            ),
        ]
    load_policy_file({"policies": policies})
    run = new_run(agent)
    checked = {"undecided": 0, "matched": 0, "not matched": 0}
    for n, (op, operand, kind) in enumerate(CONDITIONS):
        for i, value in enumerate(HOSTILE[kind] + TYPED[kind]):
            tightens = _record(agent, run["id"], f"{n}-{i}-t", f"t{n}.tightens", {"v": value})
            relaxes = _record(agent, run["id"], f"{n}-{i}-r", f"t{n}.relaxes", {"v": value})
            denies = _record(agent, run["id"], f"{n}-{i}-d", f"t{n}.denies", {"v": value})
            where = (op, operand, value)
            assert tightens.status_code == relaxes.status_code == 201, where
            t, r = tightens.json(), relaxes.json()
            if _kind(value) != kind:
                checked["undecided"] += 1
                assert (t["risk"], t["requires_approval"]) == ("critical", True), where
                assert (r["risk"], r["requires_approval"]) == ("high", True), where
                assert denies.status_code == 403, where
                assert error_of(denies)["details"]["undecided"] == ["v"], where
                continue
            matched = t["policy"]["rule"] is not None
            checked["matched" if matched else "not matched"] += 1
            assert (t["risk"], t["requires_approval"]) == (
                ("critical", True) if matched else ("low", False)
            ), where
            assert (r["risk"], r["requires_approval"]) == (("low", False) if matched else ("high", True)), (
                where
            )
            assert denies.status_code == (403 if matched else 201), where
    # Every branch was walked, many times.
    assert checked["undecided"] == 54 and min(checked.values()) >= 8, checked


def test_a_sum_limit_is_not_stretched_by_an_approved_amount_sent_as_text(agent, approver_key):
    """A person approves ``"900"`` (which the payment tool may well read as 900); the window's sum
    cannot then be shown to leave room, so the next 800 waits for a person too, where counting
    the text as nothing would have let 1,700 through a 1,000 limit unattended."""
    policy = _policy("payments.charge", risk="low", approval="auto", rules=[])
    policy["limits"] = [{"window": "24h", "per": "agent", "sum_arg": "amount", "max_sum": 1000}]
    load_policy_file({"policies": [policy]})
    run = new_run(agent)
    first = _record(agent, run["id"], "num-100", "payments.charge", {"amount": 100}).json()
    assert (first["status"], first["policy"]["limit"]) == ("planned", None)
    text = _record(agent, run["id"], "text-900", "payments.charge", {"amount": "900"}).json()
    assert (text["status"], text["policy"]["limit"]["this"]) == ("awaiting_approval", None)
    approver = Api(approver_key[1])
    granted = approver.post(f"/approvals/{text['approval']['id']}/approve", {"reason": "looks right"})
    assert granted.status_code == 200, granted.content
    after = _record(agent, run["id"], "num-800", "payments.charge", {"amount": 800}).json()
    assert after["status"] == "awaiting_approval", after
    assert (after["policy"]["limit"]["used"], after["policy"]["limit"]["this"]) == (None, 800.0)
