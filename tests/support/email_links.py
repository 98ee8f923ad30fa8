"""What the e-mail decision link tests share: an approval mailed through a real SMTP server
(tests/support/smtp.py) to the people of a tenant's e-mail channel, and a person following a link
in a browser-like HTTP client (httpx, cookies kept) against the live server."""

from __future__ import annotations

import re
from typing import Any

import django_rq
import httpx

from ledger.audit import Actor
from ledger.models import Event, ToolPolicy
from ledger.services import runs
from recovery.actions import channels
from recovery.actions.approvals import action_record_gated
from recovery.models import Approval, EmailLinkUse, Notification
from recovery.notifications import delivery
from tests.support.smtp import Received, SmtpServer

PASSWORD = "correct-horse-battery"
DECISION_KINDS = ("approval.approved", "approval.rejected", "approval.granted")


def mail_settings(settings: Any, smtp: SmtpServer, live_server: Any, **saga: Any) -> None:
    """Mail through ``smtp`` and link to ``live_server``; ``saga``: SAGA settings besides."""
    for name, value in smtp.settings().items():
        setattr(settings, name, value)
    settings.SAGA = {**settings.SAGA, "PUBLIC_URL": live_server.url, "NOTIFY_EMAILS": [], **saga}


def give_address(user: Any, address: str) -> Any:
    user.email = address
    user.save(update_fields=["email"])
    return user


def email_channel(tenant: Any, *addresses: str) -> None:
    channels.channel_create(
        tenant=tenant,
        actor=Actor.system("tests"),
        name="approvers",
        kind="email",
        target=", ".join(addresses),
    )


def ask_approval(
    tenant: Any,
    agent: Actor,
    *,
    risk: str = "medium",
    approvers: int = 1,
    amount: int = 48200,
    key: str = "pay-1",
    args: dict[str, Any] | None = None,
) -> Approval:
    """An approval of ``payments.charge`` ``args`` (default {amount, currency}) at ``risk``,
    needing ``approvers`` people (its policy's), its e-mails written to the outbox."""
    ToolPolicy.objects.update_or_create(
        tenant=tenant,
        tool="payments.charge",
        defaults={
            "risk": risk,
            "approval": "manual",
            "action_class": "external_irreversible",
            "compensation": "none",
            "approvers": approvers,
        },
    )
    run = runs.run_create(tenant=tenant, actor=agent, agent="billing", request=f"Pay invoice {key}")
    action = action_record_gated(
        run=run,
        actor=agent,
        tool="payments.charge",
        idempotency_key=key,
        args=args if args is not None else {"amount": amount, "currency": "EUR"},
    ).action
    return action.approvals.get()


def deliver_mail() -> None:
    """Send every e-mail waiting in the outbox now, as the worker's job does (the jobs the
    commits enqueued are dropped: this is them)."""
    django_rq.get_queue("notifications").empty()
    for pk in Notification.objects.filter(kind="email", status="pending").values_list("pk", flat=True):
        outcome = delivery.notification_deliver(notification_id=pk)
        assert outcome == "delivered", (pk, outcome, Notification.objects.get(pk=pk).last_error)


def only_mail(smtp: SmtpServer, address: str) -> Received:
    (received,) = smtp.wait_for_mail_to(address)
    return received


def link(received: Received, label: str) -> str:
    (url,) = received.links(label)
    return url


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def browser() -> httpx.Client:
    """A person's browser: cookies kept, redirects not followed (the tests look at each)."""
    return httpx.Client(timeout=20, follow_redirects=False)


def confirm(client: httpx.Client, url: str, *, note: str = "") -> httpx.Response:
    """Open the link and press the page's button: GET the page, POST its form."""
    page = client.get(url)
    assert page.status_code == 200, (page.status_code, page.text[:2000])
    return client.post(url, data={"csrfmiddlewaretoken": csrf_of(page.text), "note": note})


def sign_in(client: httpx.Client, base: str, redirect: httpx.Response, username: str) -> httpx.Response:
    """Follow a redirect to the login page, sign in there, and return the answer (a redirect to
    where the login page was asked to go next)."""
    assert redirect.status_code == 302, redirect.status_code
    login_url = httpx.URL(base).join(redirect.headers["Location"])
    page = client.get(login_url)
    assert page.status_code == 200
    next_path = login_url.params.get("next", "")
    return client.post(
        login_url,
        data={
            "csrfmiddlewaretoken": csrf_of(page.text),
            "username": username,
            "password": PASSWORD,
            "next": next_path,
        },
    )


def decisions_recorded(approval: Approval) -> list[str]:
    """The decision events on ``approval``'s record, in order."""
    return list(
        Event.objects.filter(subject_id=approval.pk, kind__in=DECISION_KINDS)
        .order_by("id")
        .values_list("kind", flat=True)
    )


def nothing_decided(approval: Approval) -> None:
    """``approval`` is pending with no grant, no decision on the record, and no link used."""
    approval.refresh_from_db()
    assert approval.status == Approval.Status.PENDING
    assert approval.decided_by_id is None and not approval.grants.exists()
    assert decisions_recorded(approval) == []
    assert not EmailLinkUse.objects.filter(approval_id=approval.pk).exists()
