"""Slack, as notifications and approvals use it: the Block Kit message of a notification (with
Approve / Reject buttons for an approval when the tenant connected a Slack app), the signature
check of the interactions Slack sends back, and the messages that answer them.

Sending is ``recovery.notifications``'s business (through ``ledger.outbound``'s guard, like every
URL a tenant chose); deciding is ``recovery.services``'s. This module only shapes and checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slack_sdk.signature import SignatureVerifier

APPROVE = "saga_approve"
REJECT = "saga_reject"
# A Slack message's section text is at most 3000 characters; a button value at most 2000.
_TEXT_MAX = 2900
_RISK_EMOJI = {
    "low": ":large_green_circle:",
    "medium": ":large_yellow_circle:",
    "high": ":large_orange_circle:",
}


def _cut(text: str, limit: int = _TEXT_MAX) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escape(text: str) -> str:
    # Slack's mrkdwn treats these three as control characters.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def button_value(*, tenant_slug: str, approval_id: str) -> str:
    """What an Approve / Reject button carries back: which tenant's signing secret verifies the
    interaction, and which approval it is about. Read only after the signature checked out."""
    return f"{tenant_slug}/{approval_id}"


def parse_button_value(value: object) -> tuple[str, str] | None:
    if not isinstance(value, str) or value.count("/") != 1:
        return None
    tenant_slug, approval_id = value.split("/")
    return (tenant_slug, approval_id) if tenant_slug and approval_id else None


def message(
    *,
    summary: str,
    url: str,
    risk: str,
    run_id: str,
    lines: list[str],
    tenant_slug: str,
    approval_id: str = "",
) -> dict[str, Any]:
    """The Block Kit message for a notification: the summary, risk and run, what else the event
    says, a link to the exact page, and — with ``approval_id`` — Approve / Reject buttons."""
    risk_label = f"{_RISK_EMOJI.get(risk, ':red_circle:')} {risk}" if risk else "—"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(f"*{_escape(summary)}*")}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Risk*\n{risk_label}"},
                {"type": "mrkdwn", "text": f"*Run*\n`{_escape(run_id or '—')}`"},
            ],
        },
    ]
    if lines:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": _cut("\n".join(_escape(x) for x in lines))},
            }
        )
    elements: list[dict[str, Any]] = [
        {"type": "button", "text": {"type": "plain_text", "text": "Open in Saga Admin"}, "url": url}
    ]
    if approval_id:
        value = button_value(tenant_slug=tenant_slug, approval_id=approval_id)
        elements = [
            {
                "type": "button",
                "action_id": APPROVE,
                "style": "primary",
                "text": {"type": "plain_text", "text": "Approve"},
                "value": value,
            },
            {
                "type": "button",
                "action_id": REJECT,
                "style": "danger",
                "text": {"type": "plain_text", "text": "Reject"},
                "value": value,
            },
            *elements,
        ]
    blocks.append({"type": "actions", "elements": elements})
    if approval_id:
        blocks.append(
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": f"Approve grants the arguments exactly as shown. To edit them, <{url}|open it in "
                        "the dashboard>.",
                    }
                ],
            }
        )
    return {"text": _cut(summary), "blocks": blocks}


def decided_message(*, summary: str, url: str, outcome: str, who: str, reason: str) -> dict[str, Any]:
    """Replaces an approval's message once it is decided: the buttons go, the decision stays."""
    text = f"*{_escape(summary)}*\n{outcome} by {_escape(who)}: {_escape(reason)}"
    return {
        "replace_original": True,
        "text": _cut(f"{summary} — {outcome} by {who}"),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(text)}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": f"<{url}|Open in Saga Admin>"}]},
        ],
    }


def refusal_message(text: str) -> dict[str, Any]:
    """An answer only the person who pressed the button sees; the message stays as it was."""
    return {"response_type": "ephemeral", "replace_original": False, "text": _cut(text)}


def signature_ok(*, signing_secret: str, body: bytes, timestamp: str, signature: str) -> bool:
    """Slack's v0 signature: HMAC-SHA256 over ``v0:{timestamp}:{body}`` under the app's signing
    secret, with the timestamp within five minutes of now (slack-sdk's ``SignatureVerifier``)."""
    if not signing_secret.strip() or not timestamp.isdigit() or len(timestamp) > 12:
        return False  # SignatureVerifier would raise on a non-numeric timestamp
    return SignatureVerifier(signing_secret).is_valid(body=body, timestamp=timestamp, signature=signature)


@dataclass(frozen=True)
class Interaction:
    """A button press, as far as it can be read before its signature is checked: nothing here is
    trusted until ``signature_ok`` passed with the secret of ``tenant_slug``'s Slack app."""

    tenant_slug: str
    approval_id: str
    approve: bool
    team_id: str
    user_id: str
    user_name: str
    response_url: str


def parse_interaction(payload_text: str) -> Interaction | None:
    """The one Approve / Reject press in a ``block_actions`` payload, or None for anything else
    (malformed JSON, another type, another action, missing fields)."""
    try:
        payload = json.loads(payload_text)
    except (ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return None
    actions = payload.get("actions")
    user = payload.get("user")
    team = payload.get("team")
    if not (isinstance(actions, list) and len(actions) == 1 and isinstance(actions[0], dict)):
        return None
    if not isinstance(user, dict) or not isinstance(team, dict):
        return None
    action = actions[0]
    if action.get("action_id") not in (APPROVE, REJECT):
        return None
    parsed = parse_button_value(action.get("value"))
    fields = (team.get("id"), user.get("id"), payload.get("response_url", ""))
    if parsed is None or not all(isinstance(f, str) for f in fields) or not fields[0] or not fields[1]:
        return None
    name = user.get("username") or user.get("name") or user.get("id")
    return Interaction(
        tenant_slug=parsed[0],
        approval_id=parsed[1],
        approve=action["action_id"] == APPROVE,
        team_id=str(fields[0])[:32],
        user_id=str(fields[1])[:32],
        user_name=str(name)[:100],
        response_url=str(fields[2]),
    )
