"""Slack's side of the Slack tests: requests signed the way Slack signs them (v0: HMAC-SHA256 over
``v0:{timestamp}:{body}`` with the app's signing secret, written out here rather than borrowed from
the code under test), Slack users linked the only way there is (a code the user got from the
dashboard, sent back in a signed command), and the throttle counters cleared between tests."""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import urlencode

from django.core.cache import caches

from recovery.actions import channels


def sign(body: bytes, *, secret: str, at: int | None = None) -> dict[str, str]:
    timestamp = str(at if at is not None else int(time.time()))
    digest = hmac.new(secret.encode(), b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": f"v0={digest}"}


def link_command_body(*, tenant_slug: str, code: str, team_id: str, user_id: str) -> bytes:
    """The form Slack posts for ``/saga link TENANT CODE`` typed by ``user_id``."""
    return urlencode(
        {
            "token": "deprecated-verification-token",
            "team_id": team_id,
            "team_domain": "acme",
            "channel_id": "C0APPROVALS",
            "user_id": user_id,
            "user_name": user_id.lower(),
            "command": "/saga",
            "text": f"link {tenant_slug} {code}",
            "response_url": "https://hooks.slack.com/commands/T0/1/x",
            "trigger_id": "1.2.3",
        }
    ).encode()


def link_slack_user(*, tenant, user, team_id: str, slack_user_id: str):
    """Link ``slack_user_id`` to ``user`` as the user does it: a code issued to them, redeemed
    from Slack (the services the dashboard page and the signed command call)."""
    issued = channels.slack_link_code_issue(tenant=tenant, user=user)
    return channels.slack_link_redeem(
        tenant=tenant, team_id=team_id, slack_user_id=slack_user_id, code=issued.code
    )


def clear_slack_counters() -> None:
    """The per-address and per-workspace counters live in Redis across tests."""
    client = caches["default"]._cache.get_client(write=True)  # type: ignore[attr-defined]
    for pattern in ("*throttle:slack-refused:*", "*throttle:slack-team:*"):
        for name in client.scan_iter(match=pattern):
            client.delete(name)
