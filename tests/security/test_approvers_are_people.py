"""One person, one approver: an approver key belongs to a person, a person's
login and every key they own count once towards ``approvers: N`` (409 ``already_granted``), and
none of them grants what that person asked for (403 ``self_approval``) — whether they asked as the
owner of the agent key that recorded the action, as the owner of the operator key that decided a
compensation, or through their own login. An approver key without an owner decides nothing until
one is set.

Personas: Bob approves at Acme (a login, and the keys issued to him), Trent owns Acme's approval
bot (``approver_key``), Dave is an Acme admin, Carol a viewer, Mallory an operator at Globex. Every
grant and refusal goes over real HTTP to the live server: the API with real keys, the dashboard
with a real login session.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from django.core.management import CommandError, call_command

from ledger import staff
from ledger.audit import Actor
from ledger.models import AgentKey, Compensator, Event, Tenant, ToolPolicy
from recovery.actions.compensations import unwind_start
from recovery.models import Approval, ApprovalGrant, RecoveryItem
from recovery.unwinds.advance import unwind_advance_move
from tests.factories import charge_policy, issue_key, load_policy_file

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]

PASSWORD = "correct-horse-battery"  # tests/conftest.py's _user
TWO_FOR_BIG = [{"if": {"arg": "amount", "gt": 10000}, "then": {"risk": "critical", "approvers": 2}}]


def delete_user(**_fields: Any) -> dict[str, Any]:
    """The HR system's undo (a Python compensator); these tests never get as far as running it."""
    return {}


@pytest.fixture
def policies(db: Any) -> None:
    """Creating an HR user is automatic and undone by ``hr.delete_user``, which needs a person; a
    small refund always needs a person; a charge over 10,000 needs two."""
    load_policy_file({"policies": [charge_policy(rules=TWO_FOR_BIG)]})
    for tool, risk, approval, action_class, compensation in (
        ("hr.create_user", "low", "auto", "internal_update", "custom"),
        ("hr.delete_user", "low", "manual", "internal_update", "none"),
        ("payments.small_refund", "low", "manual", "external_irreversible", "none"),
    ):
        ToolPolicy.objects.create(
            tool=tool, risk=risk, approval=approval, action_class=action_class, compensation=compensation
        )
    Compensator.objects.create(tool="hr.delete_user", kind="python", python_path=f"{__name__}.delete_user")


@pytest.fixture
def http(live_server: Any) -> Iterator[Callable[[str], httpx.Client]]:
    """``http(secret)``: an httpx client on the live server's API with that key."""
    opened: list[httpx.Client] = []

    def client(secret: str) -> httpx.Client:
        opened.append(
            httpx.Client(
                base_url=f"{live_server.url}/api/v1",
                headers={"Authorization": f"Bearer {secret}"},
                timeout=30,
            )
        )
        return opened[-1]

    yield client
    for one in opened:
        one.close()


class Dashboard:
    """A person signed in to the dashboard over HTTP (the login form, CSRF and all), deciding
    approvals as the inbox's htmx forms do."""

    def __init__(self, base_url: str, username: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=30)
        page = self.client.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text[:500]
        signed_in = self.client.post(
            "/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)},
            headers={"Referer": f"{base_url}/login/"},
        )
        assert signed_in.status_code == 302, signed_in.text[:500]
        self.base_url = base_url

    def inbox(self) -> str:
        response = self.client.get("/approvals/")
        assert response.status_code == 200
        return response.text

    def approve(self, approval: Approval, reason: str = "checked it") -> httpx.Response:
        return self._post(
            f"/approvals/{approval.pk}/approve",
            {f"{approval.pk}-reason": reason, f"{approval.pk}-shown_args_hash": approval.args_hash},
        )

    def _post(self, path: str, data: dict[str, str]) -> httpx.Response:
        return self.client.post(
            path,
            data=data,
            headers={
                "HX-Request": "true",
                "X-CSRFToken": self.client.cookies["csrftoken"],
                "Referer": f"{self.base_url}/approvals/",
            },
        )


@pytest.fixture
def dashboard(live_server: Any) -> Iterator[Callable[[str], Dashboard]]:
    opened: list[Dashboard] = []

    def sign_in(username: str) -> Dashboard:
        opened.append(Dashboard(live_server.url, username))
        return opened[-1]

    yield sign_in
    for one in opened:
        one.client.close()


def _ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code in (200, 201, 202), response.text
    return response.json()


def _refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    body = response.json()
    assert (response.status_code, body["error"]["code"]) == (status, code), body
    return body["error"]


def _approve(client: httpx.Client, approval_id: str, reason: str = "checked it") -> httpx.Response:
    return client.post(f"/approvals/{approval_id}/approve", json={"reason": reason})


def _big_charge(agent: httpx.Client) -> str:
    """A 50,000 charge that two people must approve: its approval id."""
    run = _ok(agent.post("/runs", json={"agent": "billing", "request": "Charge ACME-9"}))
    action = _ok(
        agent.post(
            f"/runs/{run['id']}/actions",
            json={"tool": "payments.charge", "idempotency_key": "big", "args": {"amount": 50000}},
        )
    )
    assert (action["status"], action["approval"]["approvers_required"]) == ("awaiting_approval", 2)
    return str(action["approval"]["id"])


def _small_refund(agent: httpx.Client) -> str:
    """A refund a person must approve: its approval id."""
    run = _ok(agent.post("/runs", json={"agent": "support", "request": "Refund order 7"}))
    action = _ok(
        agent.post(
            f"/runs/{run['id']}/actions",
            json={"tool": "payments.small_refund", "idempotency_key": "refund-7", "args": {"amount": 40}},
        )
    )
    assert action["status"] == "awaiting_approval"
    return str(action["approval"]["id"])


def _failed_onboarding(agent: httpx.Client) -> str:
    """A run that created an HR user and then failed: its recovery item id."""
    run = _ok(agent.post("/runs", json={"agent": "onboarding", "request": "Onboard Ashu"}))
    action = _ok(
        agent.post(
            f"/runs/{run['id']}/actions",
            json={
                "tool": "hr.create_user",
                "idempotency_key": "create-ashu",
                "target_id": "ashu@acme.example",
                "args": {"email": "ashu@acme.example"},
                "compensation": {"tool": "hr.delete_user", "args": {"email": "ashu@acme.example"}},
            },
        )
    )
    _ok(agent.post(f"/actions/{action['id']}/start"))
    _ok(agent.post(f"/actions/{action['id']}/succeed", json={"result": {"user_id": 7}}))
    failed = _ok(agent.post(f"/runs/{run['id']}/fail", json={"error": "licence pool empty"}))
    return str(failed["recovery_item"]["id"])


def _step_approval(unwind_id: str) -> Approval:
    """The engine's next move, as a job makes it: the undo step now waits for this approval."""
    unwind_advance_move(unwind_id=unwind_id)
    return Approval.objects.get(step__unwind_id=unwind_id)


def _refusals(approval_id: str, code: str) -> int:
    return Event.objects.filter(subject_id=approval_id, kind="decision.refused", data__code=code).count()


# --- Counted once ------------------------------------------------------------------------------


def test_two_approver_keys_of_one_person_cannot_complete_a_two_person_approval(
    http, policies, tenant, agent_key, approver_key, bob
):
    """Pass: Bob's laptop key grants the 50,000 charge (1 of 2); his CI key, of another name, is
    the same person: 409 ``already_granted``, one grant, still pending. Trent's bot completes it."""
    approval_id = _big_charge(http(agent_key[1]))
    laptop = http(issue_key(tenant, "bob-laptop", "approver", owner=bob)[1])
    ci = http(issue_key(tenant, "bob-ci", "approver", owner=bob)[1])

    first = _ok(_approve(laptop, approval_id))
    assert first["status"] == "pending"
    assert [grant["by"] for grant in first["grants"]] == ["bob (approver key bob-laptop)"]
    refused = _refused(_approve(ci, approval_id, "me again"), 409, "already_granted")
    assert refused["details"] == {"approval_id": approval_id, "approvers_required": 2, "grants": 1}
    assert Approval.objects.get(pk=approval_id).status == Approval.Status.PENDING
    assert ApprovalGrant.objects.filter(approval_id=approval_id).count() == 1
    assert _refusals(approval_id, "already_granted") == 1

    assert _ok(_approve(http(approver_key[1]), approval_id))["status"] == "approved"


def test_a_persons_login_and_their_key_count_once_in_either_order(
    http, dashboard, policies, tenant, agent_key, approver_key, bob
):
    """Pass: Bob grants one charge in the dashboard, then his key → 409 ``already_granted``; he
    grants another with his key, then in the dashboard → refused (409, the card says he already
    granted it). Each stays pending with one grant until Trent's bot grants it."""
    agent = http(agent_key[1])
    bob_key = http(issue_key(tenant, "bob-bot", "approver", owner=bob)[1])
    bob_login = dashboard("bob")

    login_first = Approval.objects.get(pk=_big_charge(agent))
    granted = bob_login.approve(login_first)
    assert granted.status_code == 200 and "1 of 2 approvers (bob)" in granted.text, granted.text
    _refused(_approve(bob_key, login_first.pk), 409, "already_granted")

    run = _ok(agent.post("/runs", json={"agent": "billing", "request": "Charge ACME-10"}))
    key_first = Approval.objects.get(
        pk=_ok(
            agent.post(
                f"/runs/{run['id']}/actions",
                json={"tool": "payments.charge", "idempotency_key": "big-2", "args": {"amount": 60000}},
            )
        )["approval"]["id"]
    )
    assert _ok(_approve(bob_key, key_first.pk))["status"] == "pending"
    again = bob_login.approve(key_first)
    assert again.status_code == 409 and "You already granted approval" in again.text, again.text

    for approval in (login_first, key_first):
        assert ApprovalGrant.objects.filter(approval=approval).count() == 1
        assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
        assert _refusals(approval.pk, "already_granted") == 1
        assert _ok(_approve(http(approver_key[1]), approval.pk))["status"] == "approved"


# --- Never one's own request -------------------------------------------------------------------


def test_the_person_behind_the_recording_agent_key_cannot_grant_its_action(
    http, dashboard, policies, tenant, approver_key, bob
):
    """Pass: Bob runs an agent with a key he owns; its refund waits for a person. Bob's approver
    key → 403 ``self_approval``; his inbox tells him he asked for it, and his login's approve →
    refused too; the refund stays pending. Trent's bot grants it."""
    bobs_agent = http(issue_key(tenant, "bobs-agent", "agent", owner=bob)[1])
    approval = Approval.objects.get(pk=_small_refund(bobs_agent))
    bob_key = http(issue_key(tenant, "bob-bot", "approver", owner=bob)[1])
    bob_login = dashboard("bob")

    refused = _refused(_approve(bob_key, approval.pk), 403, "self_approval")
    assert "owns a key of bobs-agent, which asked for it" in refused["message"]
    assert "You asked for this, so a second person must approve it" in bob_login.inbox()
    answer = bob_login.approve(approval)
    assert answer.status_code == 409 and "You cannot grant approval" in answer.text, answer.text
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    assert _refusals(approval.pk, "self_approval") == 2

    assert _ok(_approve(http(approver_key[1]), approval.pk))["status"] == "approved"


def test_the_owner_of_the_operator_key_that_decided_a_compensation_cannot_grant_its_step(
    http, dashboard, policies, tenant, agent_key, approver_key, bob
):
    """Pass: Bob's operator key compensates a failed run; the undo step waits for a person. Bob's
    approver key and his login → refused ``self_approval``; the step still waits. Trent's bot
    grants it and the step is queued."""
    item_id = _failed_onboarding(http(agent_key[1]))
    bob_ops = http(issue_key(tenant, "bob-ops", "operator", owner=bob)[1])
    unwind = _ok(bob_ops.post(f"/recovery/{item_id}/compensate", json={"reason": "undo it"}))
    approval = _step_approval(unwind["id"])
    bob_key = http(issue_key(tenant, "bob-bot", "approver", owner=bob)[1])

    _refused(_approve(bob_key, approval.pk), 403, "self_approval")
    answer = dashboard("bob").approve(approval)
    assert answer.status_code == 409 and "You cannot grant approval" in answer.text, answer.text
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING
    assert _refusals(approval.pk, "self_approval") == 2

    assert _ok(_approve(http(approver_key[1]), approval.pk))["status"] == "approved"


def test_the_operator_login_who_decided_a_compensation_cannot_grant_its_step_with_a_key(
    http, policies, tenant, agent_key, approver_key, dave
):
    """Pass: Dave (an admin) compensates a failed run through his login; his approver key → 403
    ``self_approval`` naming him; the step still waits. Trent's bot grants it."""
    item = RecoveryItem.objects.get(pk=_failed_onboarding(http(agent_key[1])))
    unwind = unwind_start(item=item, actor=Actor.for_user(dave), reason="undo it")
    approval = _step_approval(unwind.pk)
    assert approval.requested_by_id == dave.pk
    daves_key = http(issue_key(tenant, "dave-bot", "approver", owner=dave)[1])

    refused = _refused(_approve(daves_key, approval.pk), 403, "self_approval")
    assert "this key's owner (dave) asked for it" in refused["message"]
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.PENDING

    assert _ok(_approve(http(approver_key[1]), approval.pk))["status"] == "approved"


# --- Owners: required, checked, set once ------------------------------------------------------


def test_create_agent_key_refuses_an_approver_key_without_an_owner_who_approves_there(
    tenant, bob, carol, dave, mallory
):
    """Pass: ``--scopes approver`` without ``--owner``, with an unknown user, with a viewer (Carol)
    or with another tenant's operator (Mallory) exits with a message saying what to do and creates
    nothing; Bob (approver) and Dave (admin) get keys they own; an operator key may name its owner,
    and Carol may own one (any member may)."""
    refusals = [
        ({}, "An approver key belongs to a person: name them with --owner USERNAME"),
        ({"owner": "nobody"}, "No user is named 'nobody'"),
        (
            {"owner": "carol"},
            "carol is viewer at acme; an approver key's owner must have the approver or admin",
        ),
        ({"owner": "mallory"}, "mallory is not an active member of tenant acme"),
    ]
    for options, message in refusals:
        with pytest.raises(CommandError, match=re.escape(message)):
            call_command("create_agent_key", tenant="acme", name="bot", scopes="approver", **options)
    with pytest.raises(CommandError, match="An approver key belongs to a person"):
        call_command("create_agent_key", tenant="initech", name="bot", scopes="approver")
    assert not AgentKey.objects.exists() and not Tenant.objects.filter(slug="initech").exists()

    for owner in ("bob", "dave"):
        call_command("create_agent_key", tenant="acme", name=f"{owner}-bot", scopes="approver", owner=owner)
    call_command("create_agent_key", tenant="acme", name="carol-ops", scopes="operator", owner="carol")
    assert sorted(AgentKey.objects.values_list("name", "owner__username")) == [
        ("bob-bot", "bob"),
        ("carol-ops", "carol"),
        ("dave-bot", "dave"),
    ]


def test_an_unowned_approver_key_decides_nothing_until_it_is_given_an_owner_once(
    http, policies, tenant, agent_key, bob, carol, dave
):
    """Pass: an approver key from before owners existed (no owner, as the migration leaves it)
    gets 403 ``approver_key_unowned`` on approve and on reject, naming the command to run; nothing
    changes and both refusals are audited. ``set_key_owner`` refuses a viewer, then gives it to
    Bob; the key then approves, as Bob; a second ``set_key_owner`` is refused (an owner is never
    replaced)."""
    legacy, secret = issue_key(tenant, "legacy-bot", "approver", owner=bob)
    AgentKey.objects.filter(pk=legacy.pk).update(owner=None)
    legacy_key = http(secret)
    approval_id = _small_refund(http(agent_key[1]))

    refused = _refused(_approve(legacy_key, approval_id), 403, "approver_key_unowned")
    assert f"manage.py set_key_owner --prefix {legacy.prefix} --owner USERNAME" in refused["message"]
    rejected = legacy_key.post(f"/approvals/{approval_id}/reject", json={"reason": "no"})
    _refused(rejected, 403, "approver_key_unowned")
    assert Approval.objects.get(pk=approval_id).status == Approval.Status.PENDING
    assert _refusals(approval_id, "approver_key_unowned") == 2

    with pytest.raises(CommandError, match="carol is viewer at acme"):
        call_command("set_key_owner", prefix=legacy.prefix, owner="carol")
    call_command("set_key_owner", prefix=legacy.prefix, owner="bob")
    decided = _ok(_approve(legacy_key, approval_id))
    assert decided["status"] == "approved"
    assert Event.objects.filter(kind="agent_key.owner_set", data__owner="bob").count() == 1
    with pytest.raises(CommandError, match="owned by bob"):
        call_command("set_key_owner", prefix=legacy.prefix, owner="dave")
    assert AgentKey.objects.get(pk=legacy.pk).owner_id == bob.pk


def test_an_approver_key_whose_owner_lost_the_approver_role_decides_nothing(
    http, policies, tenant, agent_key, bob
):
    """Pass: Bob's key approves nothing once Bob is only a viewer at Acme (403
    ``owner_not_approver``), and works again when he is an approver again."""
    approval_id = _small_refund(http(agent_key[1]))
    bob_key = http(issue_key(tenant, "bob-bot", "approver", owner=bob)[1])
    staff.membership_set(user=bob, tenant=tenant, role="viewer", actor=Actor.system("tests"))
    _refused(_approve(bob_key, approval_id), 403, "owner_not_approver")
    assert Approval.objects.get(pk=approval_id).status == Approval.Status.PENDING
    staff.membership_set(user=bob, tenant=tenant, role="approver", actor=Actor.system("tests"))
    assert _ok(_approve(bob_key, approval_id))["status"] == "approved"
