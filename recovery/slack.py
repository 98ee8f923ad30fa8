"""Slack, as notifications and approvals use it: the Block Kit message of a notification (with
decision buttons for an approval when the tenant connected a Slack app — Approve bound to the hash
of the arguments shown, and only when they are shown whole), the signature check of what Slack
sends back, the parsing of those payloads (button presses, the ``/saga link`` command), hostile
until checked, and the messages that answer them.

Sending is ``recovery.notifications``'s business (through ``infra.outbound``'s guard, like every
URL a tenant chose); deciding is ``recovery.actions``'s. This module only shapes and checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.core import signing
from slack_sdk.signature import SignatureVerifier

APPROVE = "saga_approve"
REJECT = "saga_reject"
# A Slack message's section text is at most 3000 characters; a button value at most 2000.
_TEXT_MAX = 2900
_VALUE_MAX = 2000
_HASH_RE = re.compile(r"[0-9a-f]{64}")
# Slack's payloads nest a message's blocks a few levels deep; anything far deeper is not Slack.
MAX_PAYLOAD_DEPTH = 32
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


def button_value(*, tenant_slug: str, approval_id: str, args_hash: str = "") -> str:
    """What a button carries back: which tenant's signing secret verifies the interaction, which
    approval it is about and — on Approve — the hash of the arguments the message showed, so a
    press approves only those. Read only after the signature checked out."""
    return f"{tenant_slug}/{approval_id}/{args_hash}" if args_hash else f"{tenant_slug}/{approval_id}"


def parse_button_value(value: object) -> tuple[str, str, str] | None:
    """(tenant slug, approval id, args hash or "") of a button's value, or None if it is not one."""
    if not isinstance(value, str) or len(value) > _VALUE_MAX or not 1 <= value.count("/") <= 2:
        return None
    tenant_slug, approval_id, *rest = value.split("/")
    args_hash = rest[0] if rest else ""
    if rest and not _HASH_RE.fullmatch(args_hash):
        return None
    return (tenant_slug, approval_id, args_hash) if tenant_slug and approval_id else None


def lines_fit(lines: list[str]) -> bool:
    """Whether ``lines`` show in a message whole, without being cut to Slack's limit."""
    return len("\n".join(_escape(x) for x in lines)) <= _TEXT_MAX


def message(
    *,
    summary: str,
    url: str,
    risk: str,
    run_id: str,
    lines: list[str],
    tenant_slug: str,
    approval_id: str = "",
    args_hash: str = "",
) -> dict[str, Any]:
    """The Block Kit message for a notification: the summary, risk and run, what else the event
    says, a link to the exact page, and — with ``approval_id`` — decision buttons. Approve is
    there only with the hash of the arguments ``lines`` show (``args_hash``) and only when nothing
    had to be cut to fit Slack's limits: an approver must see everything they approve, so a cut
    message links to the inbox instead. Reject is always offered (refusing needs no detail)."""
    risk_label = f"{_RISK_EMOJI.get(risk, ':red_circle:')} {risk}" if risk else "—"
    summary_text = f"*{_escape(summary)}*"
    lines_text = "\n".join(_escape(x) for x in lines)
    was_cut = len(summary_text) > _TEXT_MAX or not lines_fit(lines)
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _cut(summary_text)}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Risk*\n{risk_label}"},
                {"type": "mrkdwn", "text": f"*Run*\n`{_escape(run_id or '—')}`"},
            ],
        },
    ]
    if lines:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(lines_text)}})
    elements: list[dict[str, Any]] = [
        {"type": "button", "text": {"type": "plain_text", "text": "Open in Saga Admin"}, "url": url}
    ]
    approvable = bool(approval_id and args_hash and not was_cut)
    if approval_id:
        buttons: list[dict[str, Any]] = []
        if approvable:
            buttons.append(
                {
                    "type": "button",
                    "action_id": APPROVE,
                    "style": "primary",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "value": button_value(
                        tenant_slug=tenant_slug, approval_id=approval_id, args_hash=args_hash
                    ),
                }
            )
        buttons.append(
            {
                "type": "button",
                "action_id": REJECT,
                "style": "danger",
                "text": {"type": "plain_text", "text": "Reject"},
                "value": button_value(tenant_slug=tenant_slug, approval_id=approval_id),
            }
        )
        elements = [*buttons, *elements]
    blocks.append({"type": "actions", "elements": elements})
    if approval_id:
        note = (
            f"Approve grants the arguments exactly as shown. To edit them, <{url}|open it in the dashboard>."
            if approvable
            else f"The arguments are too long to show here in full, so they can be approved only in "
            f"<{url}|the approval inbox>."
        )
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": note}]})
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
    # The hash of the arguments the message showed (Approve only; "" on Reject or an old message).
    args_hash: str
    approve: bool
    team_id: str
    user_id: str
    user_name: str
    response_url: str


def _too_deep(value: Any, *, max_depth: int) -> bool:
    # Iterative, so the check itself cannot exhaust the stack.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict | list):
            if depth > max_depth:
                return True
            children = current.values() if isinstance(current, dict) else current
            stack.extend((child, depth + 1) for child in children)
    return False


def load_payload(payload_text: str) -> dict[str, Any] | None:
    """The ``payload`` form field as a JSON object, or None when it is not one: not JSON, nested
    deeper than any Slack payload (``MAX_PAYLOAD_DEPTH``; deeper still, the decoder itself gives
    up with a RecursionError), or not an object."""
    try:
        payload = json.loads(payload_text)
    except (ValueError, TypeError, RecursionError):
        return None
    if not isinstance(payload, dict) or _too_deep(payload, max_depth=MAX_PAYLOAD_DEPTH):
        return None
    return payload


def _short_str(value: object, limit: int = 32) -> str:
    return value if isinstance(value, str) and 0 < len(value) <= limit else ""


def parse_interaction(payload_text: str) -> Interaction | None:
    """The one Approve / Reject press in a ``block_actions`` payload, or None for anything else
    (malformed or too deeply nested JSON, another type, another action, missing fields, fields of
    the wrong type)."""
    payload = load_payload(payload_text)
    if payload is None or payload.get("type") != "block_actions":
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
    team_id, user_id = _short_str(team.get("id")), _short_str(user.get("id"))
    response_url = payload.get("response_url", "")
    if parsed is None or not team_id or not user_id:
        return None
    if not isinstance(response_url, str) or len(response_url) > 2000:
        return None
    names = (user.get("username"), user.get("name"))
    name = next((n for n in names if isinstance(n, str) and n), user_id)
    return Interaction(
        tenant_slug=parsed[0],
        approval_id=parsed[1],
        args_hash=parsed[2] if action["action_id"] == APPROVE else "",
        approve=action["action_id"] == APPROVE,
        team_id=team_id,
        user_id=user_id,
        user_name=name[:100],
        response_url=response_url,
    )


# --- A press that only asks: the person confirms it in the dashboard -------------------------------
#
# With a signing secret a tenant admin set, anyone who knows it can sign a press as any linked Slack
# user. Such a press decides nothing: its answer links to a dashboard page where the linked person,
# signed in as themself, confirms exactly what the press asked (approve these arguments, or reject).
# The link is signed by the installation (SECRET_KEY), bound to the approval, the person, the
# choice and the arguments' hash, and short-lived; holding it without that person's session does
# nothing.

PRESS_CONFIRM_MAX_AGE_S = 30 * 60
_PRESS_SALT = "saga.slack.press-confirm"


@dataclass(frozen=True)
class PressRequest:
    """What a press asked, as its confirmation link carries it."""

    approval_id: str
    user_id: int
    approve: bool
    args_hash: str
    slack_user: str  # team/user id of the press, for the record


def press_token(request: PressRequest) -> str:
    return signing.dumps(
        {
            "a": request.approval_id,
            "u": request.user_id,
            "d": "approve" if request.approve else "reject",
            "h": request.args_hash,
            "s": request.slack_user,
        },
        salt=_PRESS_SALT,
    )


def press_from_token(token: str) -> PressRequest | None:
    """The press a confirmation link stands for, or None: forged, altered or older than
    ``PRESS_CONFIRM_MAX_AGE_S``."""
    if len(token) > 1000:
        return None
    try:
        data = signing.loads(token, salt=_PRESS_SALT, max_age=PRESS_CONFIRM_MAX_AGE_S)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    if not isinstance(data, dict):
        return None
    approval_id, user_id, choice = data.get("a"), data.get("u"), data.get("d")
    args_hash, slack_user = data.get("h"), data.get("s")
    if not (isinstance(approval_id, str) and isinstance(user_id, int) and choice in ("approve", "reject")):
        return None
    if not (isinstance(args_hash, str) and isinstance(slack_user, str)):
        return None
    return PressRequest(
        approval_id=approval_id,
        user_id=user_id,
        approve=choice == "approve",
        args_hash=args_hash,
        slack_user=slack_user,
    )


# --- Linking a Slack account: the slash command -------------------------------------------------

LINK_USAGE = "Usage: /saga link TENANT CODE — the command Saga Admin shows you under “Your Slack account”."


@dataclass(frozen=True)
class LinkCommand:
    """``/saga link TENANT CODE`` as Slack posts it (form-encoded). Like ``Interaction``, nothing
    here is trusted until the signature checked out with ``tenant_slug``'s app secret."""

    tenant_slug: str
    code: str
    team_id: str
    user_id: str


def parse_link_command(form: Mapping[str, str]) -> LinkCommand | None:
    """The link command in a slash command's form fields, or None for anything else."""
    text = form.get("text", "")
    tokens = text.split() if isinstance(text, str) and len(text) <= 200 else []
    team_id, user_id = _short_str(form.get("team_id")), _short_str(form.get("user_id"))
    if len(tokens) != 3 or tokens[0].lower() != "link" or not team_id or not user_id:
        return None
    tenant_slug, code = tokens[1], tokens[2]
    if len(tenant_slug) > 50 or len(code) > 40:
        return None
    return LinkCommand(tenant_slug=tenant_slug, code=code, team_id=team_id, user_id=user_id)


def command_reply(text: str) -> dict[str, Any]:
    """A slash command's answer: shown only to whoever typed it."""
    return {"response_type": "ephemeral", "text": _cut(text)}
