"""Attacks on approval e-mails' Approve and Reject links (recovery.notifications.email_links): each link is
mailed through a real SMTP server and attacked against the live server. A replayed link, one
forwarded to another person, one for arguments that changed since, an expired one, one fetched by
a mail scanner (GET, HEAD, a prefetch), one for an approval decided already, a forged one and a
POST without the page's CSRF token: each is refused with a page that says why and its own status
code, and nothing is decided — the database and the audit log say so."""

from __future__ import annotations

import io
import logging
import threading
import time

import httpx
import pytest
from django.core import signing

from infra.hashing import sha256_hex
from ledger.audit import Actor
from ledger.models import Event
from recovery import slack
from recovery.actions import approvals as approval_actions
from recovery.models import Approval, EmailLinkUse
from recovery.notifications import email_links
from saga_admin.logs import json_formatter
from tests.support.email_links import (
    ask_approval,
    browser,
    confirm,
    csrf_of,
    decisions_recorded,
    deliver_mail,
    email_channel,
    give_address,
    link,
    mail_settings,
    nothing_decided,
    only_mail,
    sign_in,
)
from tests.support.smtp import smtp_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def smtp(settings, live_server):
    with smtp_server() as server:
        mail_settings(settings, server, live_server)
        yield server


@pytest.fixture
def bobs_mail(smtp, tenant, bob, dave):
    """Bob (approver) and Dave (admin) have addresses; the tenant's approvers' channel mails both."""
    give_address(bob, "bob@acme.test")
    give_address(dave, "dave@acme.test")
    email_channel(tenant, "bob@acme.test", "dave@acme.test")
    return smtp


def _refused(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, (response.status_code, response.text[:1500])
    assert "data-refusal" in response.text and words in response.text, response.text[:3000]


def _signed_in(client: httpx.Client, base: str, username: str) -> None:
    """Sign ``client`` in as ``username`` through the login page."""
    answer = sign_in(client, base, httpx.Response(302, headers={"Location": "/login/"}), username)
    assert answer.status_code == 302, answer.text[:1000]


def test_a_replayed_link_decides_nothing_more(bobs_mail, tenant, agent, bob):
    """Pass: an approval that needs two people. Bob's link grants once; the same link again —
    opened, or its form posted again — is 410 and his grant stays the only one."""
    approval = ask_approval(tenant, agent, approvers=2)
    deliver_mail()
    approve = link(only_mail(bobs_mail, "bob@acme.test"), "Approve")
    with browser() as client:
        page = client.get(approve)
        token = csrf_of(page.text)
        assert client.post(approve, data={"csrfmiddlewaretoken": token}).status_code == 200
        _refused(client.get(approve), 410, "This link was used already")
        _refused(client.post(approve, data={"csrfmiddlewaretoken": token}), 410, "This link was used already")
    with browser() as elsewhere:
        _refused(elsewhere.get(approve), 410, "This link was used already")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert list(approval.grants.values_list("label", flat=True)) == ["bob"]
    assert decisions_recorded(approval) == ["approval.granted"]
    assert EmailLinkUse.objects.filter(approval=approval).count() == 1


def test_two_posts_of_one_link_racing_decide_once(bobs_mail, tenant, agent):
    """Pass: the page's form posted twice at once (a double tap, two tabs): one grant, one 200
    and one 410, whichever wins."""
    approval = ask_approval(tenant, agent, approvers=2)
    deliver_mail()
    approve = link(only_mail(bobs_mail, "bob@acme.test"), "Approve")
    clients = [browser(), browser()]
    tokens = [csrf_of(client.get(approve).text) for client in clients]
    start = threading.Barrier(2)
    answers: list[int] = []

    def press(client: httpx.Client, token: str) -> None:
        start.wait()
        answers.append(client.post(approve, data={"csrfmiddlewaretoken": token}).status_code)

    threads = [threading.Thread(target=press, args=pair) for pair in zip(clients, tokens, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    for client in clients:
        client.close()
    assert sorted(answers) == [200, 410]
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING and approval.grants.count() == 1
    assert decisions_recorded(approval) == ["approval.granted"]


def test_a_forwarded_link_is_refused_in_another_persons_session(
    bobs_mail, live_server, tenant, agent, carol, mallory
):
    """Pass: Bob's link, opened by Dave (an admin, who may approve himself) or Carol (a viewer)
    signed in as themselves, is 403 to open and to post; by Mallory (another tenant) 404. Nothing
    is decided and the link still works for Bob."""
    approval = ask_approval(tenant, agent, risk="low")
    deliver_mail()
    approve = link(only_mail(bobs_mail, "bob@acme.test"), "Approve")
    for username, status, words in (
        ("dave", 403, "This link was sent to another person"),
        ("carol", 403, "This link was sent to another person"),
        ("mallory", 404, "No such approval among those you see."),
    ):
        with browser() as client:
            _signed_in(client, live_server.url, username)
            token = csrf_of(client.get(f"{live_server.url}/approvals/").text)
            _refused(client.get(approve), status, words)
            _refused(client.post(approve, data={"csrfmiddlewaretoken": token}), status, words)
        nothing_decided(approval)
    with browser() as client:
        assert confirm(client, approve).status_code == 200
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.decided_by.username == "bob"


def test_a_forwarded_link_above_the_risk_threshold_signs_in_and_is_refused(
    bobs_mail, live_server, tenant, agent
):
    """Pass: at high risk Bob's link asks whoever opens it to sign in; Dave signs in and comes
    back to a 403: nothing is decided."""
    approval = ask_approval(tenant, agent, risk="critical")
    deliver_mail()
    approve = link(only_mail(bobs_mail, "bob@acme.test"), "Approve")
    with browser() as client:
        redirect = client.get(approve)
        assert redirect.status_code == 302
        back = sign_in(client, live_server.url, redirect, "dave")
        assert back.status_code == 302 and approve.endswith(back.headers["Location"])
        _refused(client.get(approve), 403, "This link was sent to another person")
    with browser() as anonymous:
        # Without a session, a post is sent to sign in too; it decides nothing.
        assert anonymous.post(approve, data={}).status_code in (302, 403)
    nothing_decided(approval)


def test_a_link_for_arguments_that_changed_since_is_refused(bobs_mail, tenant, agent):
    """Pass: Bob opened his link's page; the approval's arguments then changed. Posting it is
    409 and opening it again too; the approval stays pending with nothing decided."""
    approval = ask_approval(tenant, agent)
    deliver_mail()
    mine = only_mail(bobs_mail, "bob@acme.test")
    with browser() as client:
        tokens = {label: csrf_of(client.get(link(mine, label)).text) for label in ("Approve", "Reject")}
        changed = {"amount": 4_820_000, "currency": "EUR"}
        Approval.objects.filter(pk=approval.pk).update(args=changed, args_hash=sha256_hex(changed))
        for label in ("Approve", "Reject"):
            url = link(mine, label)
            _refused(client.get(url), 409, "The arguments changed since this e-mail was sent")
            _refused(
                client.post(url, data={"csrfmiddlewaretoken": tokens[label]}),
                409,
                "The arguments changed since this e-mail was sent",
            )
    nothing_decided(approval)


def test_a_link_to_an_approval_asked_again_decides_neither(bobs_mail, tenant, agent, dave):
    """Pass: Dave rejects in the inbox and the agent asks again (same tool, same args, a new
    approval). Bob's link from the first e-mail is 409 and the new approval is untouched."""
    first = ask_approval(tenant, agent)
    deliver_mail()
    approve = link(only_mail(bobs_mail, "bob@acme.test"), "Approve")
    with browser() as client:
        token = csrf_of(client.get(approve).text)
        approval_actions.approval_reject(approval=first, actor=Actor.for_user(dave), reason="not this week")
        again = approval_actions.approval_request_again(approval=first, actor=agent, reason="asking again")
        _refused(client.get(approve), 409, "was rejected already by dave")
        _refused(client.post(approve, data={"csrfmiddlewaretoken": token}), 409, "was rejected already")
    nothing_decided(again)
    assert decisions_recorded(first) == ["approval.rejected"]


def test_an_expired_link_is_refused_and_sends_to_the_inbox(
    bobs_mail, live_server, tenant, agent, monkeypatch
):
    """Pass: an e-mail whose links were made 16 minutes ago (SAGA_EMAIL_LINK_TTL_MIN is 15):
    410, "open the approval inbox", nothing decided; one made 14 minutes ago still works."""
    approval = ask_approval(tenant, agent)
    made_at = time.time() - 16 * 60
    with monkeypatch.context() as clock:
        # The links' signer stamps them 16 minutes in the past: an e-mail read late.
        clock.setattr(signing.TimestampSigner, "timestamp", lambda self: signing.b62_encode(int(made_at)))
        deliver_mail()
    old = only_mail(bobs_mail, "bob@acme.test")
    with browser() as client:
        # A CSRF token of this browser's, from the login page: the page of an expired link has no form.
        token = csrf_of(client.get(f"{live_server.url}/login/").text)
        for label in ("Approve", "Reject"):
            refused = client.get(link(old, label))
            _refused(refused, 410, "older than 15 minutes")
            assert "Open the approval inbox" in refused.text
            _refused(
                client.post(link(old, label), data={"csrfmiddlewaretoken": token}),
                410,
                "older than 15 minutes",
            )
    nothing_decided(approval)

    later = ask_approval(tenant, agent, key="pay-2")
    with monkeypatch.context() as clock:
        clock.setattr(
            signing.TimestampSigner, "timestamp", lambda self: signing.b62_encode(int(time.time() - 14 * 60))
        )
        deliver_mail()
    (_, recent) = bobs_mail.wait_for_mail_to("bob@acme.test", count=2)
    with browser() as client:
        assert confirm(client, link(recent, "Approve")).status_code == 200
    later.refresh_from_db()
    assert later.status == Approval.Status.APPROVED


SCANNERS = [
    {
        "User-Agent": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) BingPreview/1.0b"
    },
    {"User-Agent": "Microsoft Office Existence Discovery", "Purpose": "prefetch"},
    {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/130.0", "Sec-Purpose": "prefetch;prerender"},
    {"User-Agent": "Barracuda Sentinel (EE)"},
]


def test_a_scanner_following_the_link_decides_nothing(bobs_mail, tenant, agent):
    """Pass: the Approve and Reject links fetched by GET, by HEAD and by prefetching agents, again
    and again: the approval stays pending, no link is used up, nothing on the record; then Bob
    still decides with the link."""
    approval = ask_approval(tenant, agent)
    deliver_mail()
    mine = only_mail(bobs_mail, "bob@acme.test")
    for label in ("Approve", "Reject"):
        url = link(mine, label)
        for headers in SCANNERS:
            with browser() as scanner:
                page = scanner.get(url, headers=headers)
                # Kept by no cache on the way: the page shows the arguments to whoever holds the link.
                assert page.status_code == 200 and "no-store" in page.headers["Cache-Control"]
                head = scanner.head(url, headers=headers)
                assert head.status_code == 200
                # Following whatever redirect a scanner would: none (the page decides nothing).
                assert httpx.get(url, headers=headers, follow_redirects=True, timeout=20).status_code == 200
    nothing_decided(approval)
    with browser() as client:
        assert confirm(client, link(mine, "Approve")).status_code == 200
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED


def test_a_post_without_the_pages_csrf_token_decides_nothing(bobs_mail, tenant, agent):
    """Pass: a form posted to the link from elsewhere (no CSRF cookie and token: a scanner that
    submits forms, another site) is 403; the link is not used up."""
    approval = ask_approval(tenant, agent)
    deliver_mail()
    approve = link(only_mail(bobs_mail, "bob@acme.test"), "Approve")
    with browser() as client:
        assert client.post(approve, data={"note": "from elsewhere"}).status_code == 403
        assert client.post(approve, data={"csrfmiddlewaretoken": "x" * 64}).status_code == 403
    nothing_decided(approval)


def test_a_link_to_an_approval_decided_already_is_refused(bobs_mail, tenant, agent, dave):
    """Pass: Dave approved in the inbox after the e-mail went out: Bob's Approve and Reject links
    are 409, naming who decided, and the decision stays Dave's."""
    approval = ask_approval(tenant, agent)
    deliver_mail()
    mine = only_mail(bobs_mail, "bob@acme.test")
    with browser() as client:
        tokens = {label: csrf_of(client.get(link(mine, label)).text) for label in ("Approve", "Reject")}
        approval_actions.approval_approve(approval=approval, actor=Actor.for_user(dave), reason="looks right")
        for label in ("Approve", "Reject"):
            _refused(client.get(link(mine, label)), 409, "was approved already by dave")
            _refused(
                client.post(link(mine, label), data={"csrfmiddlewaretoken": tokens[label]}),
                409,
                "approved already",
            )
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.decided_by == dave
    assert decisions_recorded(approval) == ["approval.approved"]
    assert not EmailLinkUse.objects.exists()
    assert Event.objects.get(subject_id=approval.pk, kind="approval.approved").actor_label == "dave"


def test_a_forged_or_altered_link_is_unknown(bobs_mail, live_server, tenant, agent, bob):
    """Pass: a link with one character changed, one for another decision spliced from the other
    link, and a Slack confirmation's token in its place: 404, nothing decided."""
    approval = ask_approval(tenant, agent)
    deliver_mail()
    mine = only_mail(bobs_mail, "bob@acme.test")
    approve, reject = link(mine, "Approve"), link(mine, "Reject")
    token = approve.rstrip("/").rsplit("/", 1)[1]
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    spliced = reject.rstrip("/").rsplit("/", 1)[1].split(":")[0] + ":" + token.split(":", 1)[1]
    press = slack.press_token(
        slack.PressRequest(
            approval_id=approval.pk,
            user_id=bob.pk,
            approve=True,
            args_hash=approval.args_hash,
            slack_user="T/U",
        )
    )
    with browser() as client:
        token = csrf_of(client.get(f"{live_server.url}/login/").text)
        for forged in (flipped, spliced, press, "x" * 200):
            url = f"{live_server.url}/approvals/email/{forged}/"
            _refused(client.get(url), 404, "This link is not one Saga Admin made")
            _refused(
                client.post(url, data={"csrfmiddlewaretoken": token}),
                404,
                "This link is not one Saga Admin made",
            )
    # Longer than any link made here: refused before its signature is read.
    assert email_links.link_from_token("x" * 5000) == (None, email_links.UNKNOWN)
    nothing_decided(approval)


@pytest.fixture
def json_logs():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_formatter())
    root = logging.getLogger()
    root.addHandler(handler)
    yield lambda: stream.getvalue()
    root.removeHandler(handler)


def test_a_links_token_never_reaches_the_logs(bobs_mail, tenant, agent, json_logs):
    """Pass: a link refused (its request logged by Django as "Gone: <path>") and a link that
    decides: no log line carries either token, only ``/approvals/email/[redacted]/``."""
    ask_approval(tenant, agent)
    deliver_mail()
    mine = only_mail(bobs_mail, "bob@acme.test")
    approve, reject = link(mine, "Approve"), link(mine, "Reject")
    with browser() as client:
        assert confirm(client, approve).status_code == 200
        assert client.get(approve).status_code == 410
        assert client.get(reject).status_code == 409
    lines = json_logs()
    assert "/approvals/email/[redacted]/" in lines
    for url in (approve, reject):
        token = url.rstrip("/").rsplit("/", 1)[1]
        assert token not in lines and token.split(":")[0] not in lines
