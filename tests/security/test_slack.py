"""Slack cannot be used to approve as someone else.

Everything here goes over real HTTP to the live server, with requests signed the way Slack signs
them (``tests/support/slack.py``), answers posted by a real RQ job to a real receiver standing in
for Slack's ``response_url``, and a real Redis behind the throttle:

- the signing secret is write-only: never rendered again (dashboard, Django admin, API) nor
  logged, and ``manage.py slack_app`` sets it without a browser;
- a Slack account is linked only by its owner (a one-time code from the dashboard, sent back in
  a signed command): no form or admin page lets an admin link one for someone else;
- Approve is bound to the hash of the arguments its message showed, and a message whose
  arguments were cut has no Approve button (and a press that claims one is refused);
- a malformed payload is a 400, never a 500; refusals are throttled per address and verified
  requests per Slack workspace (429 with Retry-After).
"""

from __future__ import annotations

import hashlib
import http.cookiejar
import io
import json
import logging
import re
import secrets
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import django_rq
import httpx
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rq import SimpleWorker

from infra.hashing import sha256_hex
from ledger.audit import Actor
from ledger.models import Action, Event
from ledger.services import runs
from ledger.staff import membership_set
from recovery.actions import channels
from recovery.actions.approvals import action_record_gated
from recovery.models import Approval, SlackApp, SlackLinkCode, SlackUserLink
from saga_admin.logs import json_formatter
from tests.factories import gated_run, load_onboarding_policies
from tests.support.receivers import Receiver, serve_receiver
from tests.support.slack import clear_slack_counters, link_command_body, link_slack_user, sign

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "slack-" + secrets.token_hex(16)  # Acme's app
GLOBEX_SECRET = "globex-" + secrets.token_hex(16)
TEAM = "T0ACME"
PASSWORD = "correct-horse-battery"  # tests/conftest.py's personas
INTERACTIONS = "/integrations/slack/interactions"
COMMANDS = "/integrations/slack/commands"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def slack(tenant, dave, settings) -> Iterator[Receiver]:
    """Acme uses the installation's Slack app (its secret the operator's, so a press decides);
    the receiver is Slack's side (incoming webhook and the response_url of presses)."""
    with serve_receiver() as receiver:
        settings.SAGA = {
            **settings.SAGA,
            "OUTBOUND_ALLOWED_HOSTS": [receiver.host],
            "PUBLIC_URL": "https://saga.test",
            "SLACK_SIGNING_SECRET": SECRET,
        }
        channels.slack_app_use_installation(tenant=tenant, actor=Actor.system("manage.py slack_app"))
        queue = django_rq.get_queue("notifications")
        queue.empty()
        clear_slack_counters()
        yield receiver
        queue.empty()
        clear_slack_counters()


def _post(
    live_server, path: str, body: bytes, headers: dict[str, str] | None = None, **extra
) -> httpx.Response:
    return httpx.post(
        f"{live_server.url}{path}", content=body, headers={**FORM, **(headers or {})}, timeout=30, **extra
    )


def _signed(live_server, path: str, body: bytes, *, secret: str = SECRET) -> httpx.Response:
    return _post(live_server, path, body, sign(body, secret=secret))


def _press_body(
    approval: Approval,
    *,
    value: str,
    receiver: Receiver,
    action: str = "saga_approve",
    user: str = "UBOB",
    team: str = TEAM,
) -> bytes:
    payload = {
        "type": "block_actions",
        "team": {"id": team, "domain": "acme"},
        "user": {"id": user, "username": user.lower(), "team_id": team},
        "response_url": receiver.url("/respond"),
        "actions": [{"action_id": action, "type": "button", "value": value, "action_ts": "1.2"}],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def _worker_runs() -> None:
    queue = django_rq.get_queue("notifications")
    SimpleWorker([queue], connection=queue.connection).work(burst=True)


def _received(receiver: Receiver, path: str) -> list[dict[str, Any]]:
    _worker_runs()
    return [r.json for r in receiver.received if r.path == path]


def _pending(approval: Approval) -> None:
    current = Approval.objects.get(pk=approval.pk)
    assert current.status == Approval.Status.PENDING and current.decided_by_id is None
    assert not current.grants.exists()
    assert Action.objects.get(pk=current.action_id).status == Action.Status.AWAITING_APPROVAL


def _buttons(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        element.get("action_id", "link"): element
        for block in message["blocks"]
        if block["type"] == "actions"
        for element in block["elements"]
    }


def _slack_channel(tenant, dave, receiver: Receiver) -> None:
    channels.channel_create(
        tenant=tenant,
        actor=Actor.for_user(dave),
        name="#approvals",
        kind="slack",
        target=receiver.url("/hook"),
    )


def _login(client: httpx.Client, username: str) -> None:
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert token, page.text[:500]
    response = client.post(
        "/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": f"{client.base_url}login/"},
    )
    assert response.status_code == 302, response.text[:500]


def _csrf_post(client: httpx.Client, path: str, data: dict[str, Any]) -> httpx.Response:
    return client.post(
        path,
        data={**data, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": f"{client.base_url}"},
    )


def _browser(live_server) -> httpx.Client:
    # The session and CSRF cookies are Secure with DEBUG off: let the test's plain-http jar send them.
    cookies = httpx.Cookies()
    cookies.jar.set_policy(http.cookiejar.DefaultCookiePolicy(secure_protocols=("https", "wss", "http")))
    return httpx.Client(base_url=live_server.url, cookies=cookies, timeout=30)


# --- Approve is bound to what the message showed --------------------------------------------------


def test_a_message_whose_args_were_cut_has_no_approve_and_a_signed_approve_press_is_refused(
    live_server, tenant, agent, bob, dave, slack
):
    """Pass: an approval whose args (5000 characters) cannot be shown whole is announced without
    an Approve button (Reject and a link to the inbox only). Signed Approve presses for it — one
    carrying the Reject button's value, one carrying the true args hash — are refused and change
    nothing; Reject still works."""
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    _slack_channel(tenant, dave, slack)
    load_onboarding_policies()
    run = runs.run_create(tenant=tenant, actor=agent, agent="support-agent", request="Refund a long order")
    action = action_record_gated(
        run=run,
        actor=agent,
        tool="payments.refund",
        idempotency_key="refund-long",
        target_type="order",
        target_id="order-8",
        args={"amount": 40, "currency": "EUR", "note": "x" * 5000},
        intent={"reasoning": "Double charged.", "confidence": 0.9},
        before_snapshot={"refunded": 0},
    ).action
    approval = action.approvals.get()

    [message] = _received(slack, "/hook")
    buttons = _buttons(message)
    assert "saga_approve" not in buttons and "saga_reject" in buttons
    assert buttons["link"]["url"] == f"https://saga.test/approvals/#approval-{approval.pk}"
    assert "approved only in" in json.dumps(message["blocks"])

    for value in (buttons["saga_reject"]["value"], f"acme/{approval.pk}/{approval.args_hash}"):
        response = _signed(live_server, INTERACTIONS, _press_body(approval, value=value, receiver=slack))
        assert response.status_code == 200
        _pending(approval)
    refusals = _received(slack, "/respond")
    assert len(refusals) == 2 and all(r["response_type"] == "ephemeral" for r in refusals)
    assert "nothing was decided" in refusals[0]["text"] and "inbox" in refusals[1]["text"]

    reject = _press_body(
        approval, value=buttons["saga_reject"]["value"], receiver=slack, action="saga_reject"
    )
    assert _signed(live_server, INTERACTIONS, reject).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.REJECTED


def test_an_approve_press_whose_args_hash_is_not_the_approvals_is_refused(
    live_server, tenant, agent, bob, dave, slack
):
    """Pass: the Approve button carries the hash of the args its message showed. A signed press
    with another hash is refused; so is the message's own button once the approval's args no
    longer hash to what it showed; nothing changes either time. With the current hash it
    approves."""
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    _slack_channel(tenant, dave, slack)
    _run, _action, approval = gated_run(tenant, agent)
    [message] = _received(slack, "/hook")
    shown = _buttons(message)["saga_approve"]["value"]
    assert shown == f"acme/{approval.pk}/{approval.args_hash}"
    assert '\\"amount\\": 40' in json.dumps(message["blocks"])  # the args it binds are shown

    other = f"acme/{approval.pk}/{sha256_hex({'amount': 4000, 'currency': 'EUR'})}"
    assert (
        _signed(live_server, INTERACTIONS, _press_body(approval, value=other, receiver=slack)).status_code
        == 200
    )
    _pending(approval)

    # The approval's args change after the message went (as if rewritten behind its back).
    bigger = {"amount": 4000, "currency": "EUR"}
    Approval.objects.filter(pk=approval.pk).update(args=bigger, args_hash=sha256_hex(bigger))
    assert (
        _signed(live_server, INTERACTIONS, _press_body(approval, value=shown, receiver=slack)).status_code
        == 200
    )
    _pending(approval)
    refusals = _received(slack, "/respond")
    assert len(refusals) == 2 and all("changed since they were shown" in r["text"] for r in refusals)
    assert Event.objects.filter(kind="approval.approved").count() == 0

    current = f"acme/{approval.pk}/{sha256_hex(bigger)}"
    assert (
        _signed(live_server, INTERACTIONS, _press_body(approval, value=current, receiver=slack)).status_code
        == 200
    )
    decided = Approval.objects.get(pk=approval.pk)
    assert decided.status == Approval.Status.APPROVED and decided.decided_by == bob
    assert decided.approved_args == bigger


# --- Links: only the person themself ------------------------------------------------------------


def test_a_person_links_their_own_slack_account_end_to_end_and_then_approves(
    live_server, tenant, agent, bob, slack
):
    """Pass: Bob, signed in, gets a one-time code on "Your Slack account" (stored only as its
    hash), sends it from Slack in a signed /saga command and is linked; his signed Approve press
    then approves as bob. The same command again links nothing (single-use)."""
    with _browser(live_server) as browser:
        _login(browser, "bob")
        assert browser.get("/account/slack/").status_code == 200
        page = _csrf_post(browser, "/account/slack/acme/code", {})
        assert page.status_code == 200
        command = re.search(r'<code id="link-command">/saga link acme ([0-9A-Z-]{19})</code>', page.text)
        assert command, page.text[:3000]
    code = command.group(1)
    stored = SlackLinkCode.objects.get(user=bob, tenant=tenant)
    assert stored.code_hash == hashlib.sha256(code.replace("-", "").encode()).hexdigest()
    assert code.replace("-", "") not in json.dumps(list(SlackLinkCode.objects.values()), default=str)

    body = link_command_body(tenant_slug="acme", code=code, team_id=TEAM, user_id="UBOB")
    linked = _signed(live_server, COMMANDS, body)
    assert linked.status_code == 200, linked.text
    assert linked.json()["response_type"] == "ephemeral" and "acts as bob" in linked.json()["text"]
    link = SlackUserLink.objects.get()
    assert (link.team_id, link.slack_user_id, link.user, link.confirmed_at is not None) == (
        TEAM,
        "UBOB",
        bob,
        True,
    )
    assert not SlackLinkCode.objects.exists()

    again = _signed(live_server, COMMANDS, body)
    assert again.status_code == 200 and "unknown, used or expired" in again.json()["text"]

    _run, _action, approval = gated_run(tenant, agent)
    value = f"acme/{approval.pk}/{approval.args_hash}"
    assert (
        _signed(live_server, INTERACTIONS, _press_body(approval, value=value, receiver=slack)).status_code
        == 200
    )
    decided = Approval.objects.get(pk=approval.pk)
    assert decided.status == Approval.Status.APPROVED and decided.decided_by == bob
    assert Event.objects.filter(kind="slack_user.linked", actor_label="bob").count() == 1

    # And he can take it back himself.
    with _browser(live_server) as browser:
        _login(browser, "bob")
        assert "T0ACME/UBOB" in browser.get("/account/slack/").text
        assert _csrf_post(browser, f"/notifications/slack-users/{link.pk}/remove", {}).status_code == 303
    assert not SlackUserLink.objects.exists()


def test_an_admin_cannot_link_a_slack_account_to_someone_else(
    live_server, tenant, other_tenant, agent, dave, bob, slack
):
    """Pass: Dave (Acme admin) finds no form or admin page that links a Slack id to Bob (404 on
    the old dashboard form, 403 on the Django admin's add page); a code he asks for while naming
    Bob is his own, and links whoever sends it to dave, never to bob; made-up, reused, expired and
    other-tenant codes link nothing; a link an admin typed in before (unconfirmed) decides
    nothing."""
    membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))  # staff: the admin
    with _browser(live_server) as browser:
        _login(browser, "dave")
        typed = _csrf_post(
            browser,
            "/notifications/settings/acme/slack-users",
            {"team_id": TEAM, "slack_user_id": "UDAVE", "user": bob.pk},
        )
        assert typed.status_code == 404
        assert browser.get("/admin/recovery/slackuserlink/add/").status_code == 403
        forged_admin = _csrf_post(
            browser,
            "/admin/recovery/slackuserlink/add/",
            {"tenant": tenant.pk, "team_id": TEAM, "slack_user_id": "UDAVE", "user": bob.pk},
        )
        assert forged_admin.status_code == 403
        page = _csrf_post(browser, "/account/slack/acme/code", {"user": bob.pk, "user_id": bob.pk})
        code = re.search(r"/saga link acme ([0-9A-Z-]{19})", page.text).group(1)
    assert not SlackUserLink.objects.exists()
    assert SlackLinkCode.objects.get().user == dave  # the code is the signed-in user's, whatever was posted

    # Dave sends his code from a Slack account: it becomes dave's, not bob's.
    assert (
        _signed(
            live_server,
            COMMANDS,
            link_command_body(tenant_slug="acme", code=code, team_id=TEAM, user_id="UDAVE"),
        ).status_code
        == 200
    )
    assert SlackUserLink.objects.get(slack_user_id="UDAVE").user == dave

    # Bob's own code: made up, sent to another tenant's app, used after it expired.
    SlackApp.objects.create(tenant=other_tenant, signing_secret=GLOBEX_SECRET)
    issued = channels.slack_link_code_issue(tenant=tenant, user=bob)
    attempts = [
        (
            link_command_body(tenant_slug="acme", code="0000-0000-0000-0000", team_id=TEAM, user_id="UEVE"),
            SECRET,
        ),
        (
            link_command_body(tenant_slug=other_tenant.slug, code=issued.code, team_id=TEAM, user_id="UEVE"),
            GLOBEX_SECRET,
        ),
    ]
    for body, secret in attempts:
        refused = _signed(live_server, COMMANDS, body, secret=secret)
        assert refused.status_code == 200 and "unknown, used or expired" in refused.json()["text"]
    SlackLinkCode.objects.filter(user=bob).update(expires_at=timezone.now() - timedelta(seconds=1))
    expired = _signed(
        live_server,
        COMMANDS,
        link_command_body(tenant_slug="acme", code=issued.code, team_id=TEAM, user_id="UEVE"),
    )
    assert "unknown, used or expired" in expired.json()["text"]
    assert not SlackUserLink.objects.filter(user=bob).exists()

    # A link an admin typed in under the old form: listed, removable, and worth nothing.
    SlackUserLink.objects.create(tenant=tenant, team_id=TEAM, slack_user_id="UEVE", user=bob)
    _run, _action, approval = gated_run(tenant, agent)
    value = f"acme/{approval.pk}/{approval.args_hash}"
    press = _press_body(approval, value=value, receiver=slack, user="UEVE")
    assert _signed(live_server, INTERACTIONS, press).status_code == 200
    _pending(approval)
    [refusal] = _received(slack, "/respond")
    assert "not linked" in refusal["text"]


# --- The signing secret is write-only -------------------------------------------------------------


@pytest.fixture
def debug_logs() -> Iterator[io.StringIO]:
    """Everything this process (and so the live server's thread) logs, at DEBUG, as the product
    formats it."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_the_signing_secret_is_never_shown_again_nor_logged(
    live_server, tenant, agent, dave, bob, operator_key, approver_key, settings, monkeypatch, debug_logs
):
    """Pass: a secret set in the dashboard form, then replaced in the Django admin, then by
    ``manage.py slack_app`` is used (a press signed with it is verified) and appears in no page —
    the settings page after saving, the Django admin's list, change and history pages, every GET
    of the API an operator or approver key reaches — nor in the audit log, the command's output or
    any log line at DEBUG."""
    membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))
    first, second, third = ("slack-" + secrets.token_hex(16) for _ in range(3))
    pages: list[str] = []
    with _browser(live_server) as browser:
        _login(browser, "dave")
        saved = _csrf_post(browser, "/notifications/settings/acme/slack", {"signing_secret": first})
        assert saved.status_code == 303
        pages.append(browser.get("/notifications/settings/?tenant=acme").text)
        assert SlackApp.objects.get().signing_secret == first
        app = SlackApp.objects.get()
        change = f"/admin/recovery/slackapp/{app.pk}/change/"
        pages.append(browser.get(change).text)
        assert 'name="new_signing_secret"' in pages[-1]
        rekeyed = _csrf_post(browser, change, {"new_signing_secret": second, "_save": "Save"})
        assert rekeyed.status_code == 302, rekeyed.text[:2000]
        kept = _csrf_post(browser, change, {"new_signing_secret": "", "_save": "Save"})  # blank keeps it
        assert kept.status_code == 302
        assert SlackApp.objects.get().signing_secret == second
        for path in ("/admin/recovery/slackapp/", change, f"/admin/recovery/slackapp/{app.pk}/history/"):
            response = browser.get(path)
            assert response.status_code == 200
            pages.append(response.text)

    monkeypatch.setenv("SAGA_TEST_SLACK_SECRET", third)
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "slack_app",
        "--tenant",
        "acme",
        "--signing-secret-env",
        "SAGA_TEST_SLACK_SECRET",
        stdout=out,
        stderr=err,
    )
    assert "Connected the Slack app of acme" in out.getvalue()
    assert SlackApp.objects.get().signing_secret == third

    # The secret in use: a press signed with it is verified, one signed with an old one is not.
    _run, _action, approval = gated_run(tenant, agent)
    body = urlencode(
        {
            "payload": json.dumps(
                {
                    "type": "block_actions",
                    "team": {"id": TEAM},
                    "user": {"id": "UNOBODY"},
                    "response_url": "https://hooks.slack.test/x",
                    "actions": [{"action_id": "saga_reject", "value": f"acme/{approval.pk}"}],
                }
            )
        }
    ).encode()
    assert _signed(live_server, INTERACTIONS, body, secret=third).status_code == 200
    assert _signed(live_server, INTERACTIONS, body, secret=second).status_code == 401

    from saga_admin.api.app import api

    document = api.get_openapi_schema()
    for key in (operator_key[1], approver_key[1]):
        with httpx.Client(
            base_url=live_server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        ) as client:
            for path, methods in document["paths"].items():
                if "get" in methods and "{" not in path:
                    pages.append(client.get(path).text)

    audit = json.dumps(list(Event.objects.values("kind", "data", "reason")), default=str)
    everything = "\n".join(pages) + audit + out.getvalue() + err.getvalue() + debug_logs.getvalue()
    assert "slack_app.rekeyed" in audit  # the audit log was read
    assert "slack.signature_refused" in debug_logs.getvalue()  # and so were the live server's logs
    leaked = [
        name
        for name, value in (("first", first), ("second", second), ("third", third))
        if value in everything
    ]
    assert not leaked, leaked


def test_manage_py_slack_app_refuses_what_it_cannot_use(tenant, monkeypatch):
    """Pass: an unset variable, a too-short secret and an unknown tenant are refused (nothing
    stored); --remove disconnects."""
    monkeypatch.setenv("SAGA_TEST_SHORT", "short")
    for args in (
        ("--tenant", "acme", "--signing-secret-env", "SAGA_TEST_UNSET_NAME"),
        ("--tenant", "acme", "--signing-secret-env", "SAGA_TEST_SHORT"),
        ("--tenant", "nope", "--signing-secret-env", "SAGA_TEST_SHORT"),
    ):
        with pytest.raises(CommandError):
            call_command("slack_app", *args)
    assert not SlackApp.objects.exists()
    monkeypatch.setenv("SAGA_TEST_GOOD", "g" * 32)
    call_command(
        "slack_app", "--tenant", "acme", "--signing-secret-env", "SAGA_TEST_GOOD", stdout=io.StringIO()
    )
    call_command("slack_app", "--tenant", "acme", "--remove", stdout=io.StringIO())
    assert not SlackApp.objects.exists()


# --- Hostile payloads and floods ------------------------------------------------------------------


def _payload_form(payload: object) -> bytes:
    return urlencode({"payload": payload if isinstance(payload, str) else json.dumps(payload)}).encode()


def _press(**changes: Any) -> dict[str, Any]:
    press: dict[str, Any] = {
        "type": "block_actions",
        "team": {"id": TEAM},
        "user": {"id": "UBOB", "username": "bob"},
        "response_url": "https://hooks.slack.test/x",
        "actions": [{"action_id": "saga_reject", "value": "acme/apr_x"}],
    }
    press.update(changes)
    return press


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"blocks": [value]}
    return value


MALFORMED_PRESSES = {
    "not JSON": _payload_form("{'type': block_actions"),
    "a JSON array": _payload_form([1, 2]),
    "nested past the decoder": _payload_form("[" * 200_000 + "]" * 200_000),
    "nested deeper than Slack nests": _payload_form(_press(message=_nested(40))),
    "actions an object": _payload_form(_press(actions={"action_id": "saga_reject"})),
    "value a number": _payload_form(_press(actions=[{"action_id": "saga_approve", "value": 7}])),
    "value with a bad hash": _payload_form(
        _press(actions=[{"action_id": "saga_approve", "value": "acme/apr_x/zz"}])
    ),
    "team id a number": _payload_form(_press(team={"id": 5})),
    "user a list": _payload_form(_press(user=["UBOB"])),
    "user id too long": _payload_form(_press(user={"id": "U" * 5000})),
    "response_url a number": _payload_form(_press(response_url=5)),
    "no payload field": b"other=1",
    "not UTF-8": b"payload=%ff%fe%00",
}
MALFORMED_COMMANDS = {
    "no text": urlencode({"team_id": TEAM, "user_id": "UBOB"}).encode(),
    "not a link": urlencode({"team_id": TEAM, "user_id": "UBOB", "text": "approve everything"}).encode(),
    "no team": urlencode({"user_id": "UBOB", "text": "link acme AAAA-BBBB-CCCC-DDDD"}).encode(),
    "text too long": urlencode(
        {"team_id": TEAM, "user_id": "UBOB", "text": "link acme " + "A" * 5000}
    ).encode(),
}


def test_malformed_payloads_are_a_400_never_a_500(live_server, tenant, slack, settings):
    """Pass: signed (so the signature is not what refuses them) and unsigned, over HTTP: not
    JSON, nested deeper than the JSON decoder goes or deeper than Slack nests, fields of the wrong
    type or size, a body over the size limit, another content type — each a 400 in the error
    shape, for presses and link commands alike; nothing is decided or linked."""
    settings.SAGA = {**settings.SAGA, "UNAUTHENTICATED_RATE": "10000/m", "MAX_BODY_BYTES": 256 * 1024}
    huge = _payload_form(_press(padding="p" * 300 * 1024))
    cases = [(INTERACTIONS, name, body) for name, body in MALFORMED_PRESSES.items()]
    cases += [(COMMANDS, name, body) for name, body in MALFORMED_COMMANDS.items()]
    cases += [(INTERACTIONS, "over the size limit", huge), (COMMANDS, "over the size limit", huge)]
    for path, name, body in cases:
        for headers in (sign(body, secret=SECRET), {}):
            response = _post(live_server, path, body, headers)
            assert response.status_code == 400, (path, name, response.status_code, response.text[:300])
            assert response.json()["error"]["code"] == "invalid_request", (path, name)
    press = _payload_form(_press())
    for content_type in ("application/json", "multipart/form-data; boundary=x"):
        response = _post(
            live_server, INTERACTIONS, press, {**sign(press, secret=SECRET), "Content-Type": content_type}
        )
        assert response.status_code == 400, content_type
    assert (
        not SlackUserLink.objects.exists()
        and not Event.objects.filter(kind__startswith="approval.").exclude(kind="approval.requested").exists()
    )


def test_refusals_are_throttled_per_address_and_presses_per_slack_workspace(
    live_server, tenant, agent, bob, slack, settings
):
    """Pass: after 3 refused requests (bad signature) from one address, the 4th is a 429 with
    Retry-After, while a verified press from that same address is still served (nobody uses up
    Slack's own addresses with forgeries). Verified requests count per workspace: its 4th within
    the window is a 429 with Retry-After; another workspace is still served."""
    settings.SAGA = {**settings.SAGA, "UNAUTHENTICATED_RATE": "3/h", "SLACK_RATE": "3/h"}
    link_slack_user(tenant=tenant, user=bob, team_id=TEAM, slack_user_id="UBOB")
    _run, _action, approval = gated_run(tenant, agent)
    press = _press_body(approval, value=f"acme/{approval.pk}", receiver=slack, action="saga_reject")

    forged = sign(press, secret="not-acmes-secret-" + "0" * 16)
    assert [_post(live_server, INTERACTIONS, press, forged).status_code for _ in range(3)] == [401, 401, 401]
    throttled = _post(live_server, INTERACTIONS, press, forged)
    assert throttled.status_code == 429 and throttled.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(throttled.headers["Retry-After"]) <= 3600
    _pending(approval)

    assert [_signed(live_server, INTERACTIONS, press).status_code for _ in range(3)] == [200, 200, 200]
    over = _signed(live_server, INTERACTIONS, press)
    assert over.status_code == 429 and 1 <= int(over.headers["Retry-After"]) <= 3600
    elsewhere = _press_body(
        approval, value=f"acme/{approval.pk}", receiver=slack, action="saga_reject", team="T0OTHER"
    )
    assert _signed(live_server, INTERACTIONS, elsewhere).status_code == 200
    # The one press that decided was the first verified one; the rest found it decided.
    assert Approval.objects.get(pk=approval.pk).status == Approval.Status.REJECTED
    assert Event.objects.filter(kind="approval.rejected").count() == 1


def test_a_view_only_admin_user_sees_the_slack_app_without_its_secret(tenant, dave, client):
    """Pass: a staff user who may only view Slack apps in the Django admin gets the change page
    (200) with the tenant and no trace of the secret (a read-only field would print it)."""
    from django.contrib.auth.models import Permission

    channels.slack_app_set(tenant=tenant, actor=Actor.for_user(dave), signing_secret=SECRET)
    membership_set(user=dave, tenant=tenant, role="admin", actor=Actor.system("tests"))
    dave.groups.clear()  # staff of Acme, but only the one permission below
    dave.user_permissions.set([Permission.objects.get(codename="view_slackapp")])
    client.force_login(dave)
    page = client.get(f"/admin/recovery/slackapp/{SlackApp.objects.get().pk}/change/")
    assert page.status_code == 200 and "acme" in page.content.decode().lower()
    assert SECRET not in page.content.decode() and "new_signing_secret" not in page.content.decode()
