"""Microsoft Teams, as notifications use it: the message a Teams channel's Workflows webhook
("Post to a channel when a webhook request is received") or Office 365 incoming webhook takes — one
Adaptive Card (schema 1.4, which Teams renders on desktop, web and mobile) — built from an outbox
row's summary, facts and lines.

An approval's card shows the tool, risk, run, who asked, the deadline and the exact arguments, with
buttons that open the dashboard: "Approve…" and "Reject…" open the approval in the inbox with that
decision chosen, where the signed-in person confirms it (a channel is not one person, so nothing
on a card decides by itself); "Open in Saga Admin" opens its page. A webhook cannot change a card
it posted, so reminders, escalations, expiry and decisions post a card of their own that follows
it. Every other event gets a simpler card: its summary, what it says, and the link.

Everything on a card is data: the card is built as dicts and serialised once, so no text (an
argument, a tool name, a reason) can add JSON to it; every text goes into a TextRun, which Teams
shows as written (a TextBlock or a FactSet would read Markdown: a link in an argument would become
a link); each piece is cut to a size that keeps the message well inside Teams' limit (about
28 KB), saying where it was cut.

Sending is ``recovery.notifications``'s business (through ``infra.outbound``'s guard, like every
URL a tenant chose); this module only shapes.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

CARD_SCHEMA = "http://adaptivecards.io/schemas/adaptive-card.json"
CARD_VERSION = "1.4"
CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"

# What a choice on the inbox page is called in its query (``?approval=ID&decide=approve``).
DECIDE_APPROVE = "approve"
DECIDE_REJECT = "reject"
DECISIONS = (DECIDE_APPROVE, DECIDE_REJECT)

# Teams refuses a message over about 28 KB. These keep a card well under it whatever it says.
SUMMARY_MAX = 400
FACT_VALUE_MAX = 300
LINE_MAX = 1_000
LINES_MAX = 12
ARGS_MAX = 12_000
FACTS_MAX = 10

_RISK_COLOR = {"low": "Good", "medium": "Warning", "high": "Attention", "critical": "Attention"}
_ARGS_PREFIX = "Args: "


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and a note of how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def decision_url(*, approvals_url: str, approval_id: str, decide: str = "") -> str:
    """The inbox page of one approval (``approvals_url``: the inbox's absolute URL), with a
    decision chosen (``decide``: approve or reject) for the person to confirm there."""
    query = {"approval": approval_id, **({"decide": decide} if decide else {})}
    return f"{approvals_url}?{urlencode(query)}#approval-{approval_id}"


def _text(text: str, **style: Any) -> dict[str, Any]:
    # A RichTextBlock of one TextRun: shown exactly as written, never read as Markdown.
    return {"type": "RichTextBlock", "inlines": [{"type": "TextRun", "text": text, **style}]}


def _facts(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    # Label in bold, then the value: TextRuns, so neither is read as Markdown (a FactSet's are).
    return {
        "type": "Container",
        "items": [
            {
                "type": "RichTextBlock",
                "inlines": [
                    {"type": "TextRun", "text": f"{cut(label, 60)}: ", "weight": "Bolder"},
                    {"type": "TextRun", "text": cut(value, FACT_VALUE_MAX)},
                ],
            }
            for label, value in pairs[:FACTS_MAX]
        ],
    }


def message(
    *,
    summary: str,
    url: str,
    risk: str,
    run_id: str,
    lines: list[str],
    facts: list[tuple[str, str]] | None = None,
    approve_url: str = "",
    reject_url: str = "",
) -> dict[str, Any]:
    """The Workflows / incoming-webhook message: ``{"type": "message", "attachments": [one
    Adaptive Card]}``. The card shows ``summary``, the risk and run, ``facts`` (label, value),
    ``lines`` (a line ``Args: …`` as the arguments, in monospace, cut past ``ARGS_MAX``; a line
    that is a fact's value, or says ``Label: value`` of one, is not said twice) and buttons:
    "Approve…" and "Reject…" with ``approve_url`` / ``reject_url`` (an approval still to decide),
    and "Open in Saga Admin"."""
    pairs = [("Risk", risk or "—"), ("Run", run_id or "—"), *(facts or [])]
    said = {value for _label, value in pairs}
    body: list[dict[str, Any]] = [
        _text(
            cut(summary, SUMMARY_MAX), weight="Bolder", size="Medium", color=_RISK_COLOR.get(risk, "Default")
        ),
        _facts(pairs),
    ]
    args = ""
    other: list[str] = []
    for line in lines:
        if line.startswith(_ARGS_PREFIX) and not args:
            args = line.removeprefix(_ARGS_PREFIX)
        elif line not in said and line.partition(": ")[2] not in said - {""}:
            other.append(line)
    for line in other[:LINES_MAX]:
        body.append(_text(cut(line, LINE_MAX)))
    if len(other) > LINES_MAX:
        body.append(_text(f"… and {len(other) - LINES_MAX} more lines in Saga Admin.", isSubtle=True))
    if args:
        body.append(_text("Arguments", weight="Bolder"))
        shown = (
            args
            if len(args) <= ARGS_MAX
            else f"{args[:ARGS_MAX]}\n… cut here: the approval page shows them whole"
        )
        body.append(
            {
                "type": "Container",
                "style": "emphasis",
                "items": [_text(shown, fontType="Monospace")],
            }
        )
    actions: list[dict[str, Any]] = []
    if approve_url:
        actions.append(
            {"type": "Action.OpenUrl", "title": "Approve…", "url": approve_url, "style": "positive"}
        )
    if reject_url:
        actions.append(
            {"type": "Action.OpenUrl", "title": "Reject…", "url": reject_url, "style": "destructive"}
        )
    actions.append({"type": "Action.OpenUrl", "title": "Open in Saga Admin", "url": url})
    if approve_url or reject_url:
        body.append(
            _text(
                "Approve… and Reject… open the approval in Saga Admin, where you confirm the decision "
                "signed in as yourself; nothing here decides by itself.",
                isSubtle=True,
                size="Small",
            )
        )
    card = {
        "$schema": CARD_SCHEMA,
        "type": "AdaptiveCard",
        "version": CARD_VERSION,
        "fallbackText": cut(summary, SUMMARY_MAX),
        "body": body,
        "actions": actions,
    }
    return {
        "type": "message",
        "attachments": [{"contentType": CONTENT_TYPE, "contentUrl": None, "content": card}],
    }
