"""A local Microsoft Teams Workflows webhook for the tests: it takes what a Teams channel posts only
when it is the Workflows / incoming-webhook message (``{"type": "message", "attachments": [...]}``)
with Adaptive Cards that the official schema accepts (``tests/support/adaptive_card/``, Draft 6,
as the schema declares), and answers 400 with the schema's complaint otherwise — so a broken card
fails its notification (a 4xx fails a row at once) and the test that sent it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from tests.support.receivers import Receiver, serve_receiver

SCHEMA_FILE = Path(__file__).resolve().parent / "adaptive_card" / "adaptive-card.json"

# The envelope Workflows' "Post to a channel when a webhook request is received" and the Office 365
# incoming webhook take: a message whose attachments are Adaptive Cards.
MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "attachments"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "message"},
        "attachments": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["contentType", "content"],
                "additionalProperties": False,
                "properties": {
                    "contentType": {"const": "application/vnd.microsoft.card.adaptive"},
                    "contentUrl": {"type": "null"},
                    "content": {"type": "object"},
                },
            },
        },
    },
}


@cache
def card_validator() -> jsonschema.Draft6Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft6Validator.check_schema(schema)
    return jsonschema.Draft6Validator(schema)


def card_problems(raw: bytes) -> str:
    """Why ``raw`` is not a Teams message of valid Adaptive Cards ("" when it is one)."""
    try:
        message = json.loads(raw)
    except ValueError as exc:
        return f"not JSON: {exc}"
    problems = [
        f"message: {e.message}" for e in jsonschema.Draft6Validator(MESSAGE_SCHEMA).iter_errors(message)
    ]
    if problems:
        return "; ".join(problems)
    for index, attachment in enumerate(message["attachments"]):
        card = attachment["content"]
        # The deepest, most telling of the schema's complaints (a card's elements are an anyOf).
        error = jsonschema.exceptions.best_match(card_validator().iter_errors(card))
        if error is not None:
            path = "/".join(str(p) for p in error.absolute_path)
            problems.append(f"attachment {index} at /{path}: {error.message[:300]}")
        if card.get("type") != "AdaptiveCard" or card.get("version") not in ("1.4", "1.5"):
            problems.append(f"attachment {index}: not an AdaptiveCard of version 1.4 or 1.5")
    return "; ".join(problems)


@contextmanager
def serve_teams() -> Iterator[Receiver]:
    """A receiver (``tests.support.receivers``) that refuses, with 400, any invalid card."""
    with serve_receiver(check=card_problems) as receiver:
        yield receiver


def cards(receiver: Receiver) -> list[dict[str, Any]]:
    """The cards ``receiver`` took, in order."""
    return [r.json["attachments"][0]["content"] for r in receiver.received if not card_problems(r.raw)]


def card_text(card: dict[str, Any]) -> str:
    """Everything a card says, as one string: its texts, facts and button titles."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("text", "title", "value"):
                if isinstance(node.get(key), str):
                    found.append(node[key])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(card.get("body", []))
    walk(card.get("actions", []))
    return "\n".join(found)


def buttons(card: dict[str, Any]) -> dict[str, str]:
    """A card's buttons: title → URL."""
    return {a["title"]: a["url"] for a in card.get("actions", []) if a.get("type") == "Action.OpenUrl"}
