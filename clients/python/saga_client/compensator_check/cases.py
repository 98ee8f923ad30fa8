"""The protocol's cases, as data: ``cases.json`` is a copy of ``clients/spec/compensator-cases.json``
(a test keeps the two equal), so the kit, the server's dashboard check and a kit in another
language run the same cases."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CASES_FILE = Path(__file__).with_name("cases.json")

PASS = "pass"
FAIL = "fail"
NOT_SUPPORTED = "not_supported"
ERROR = "error"


@dataclass(frozen=True)
class Case:
    id: str
    title: str
    required: bool
    harmless: bool
    send: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)
    state: str | None = None
    tls: bool = False
    repeat: bool = False
    latency: bool = False


@dataclass(frozen=True)
class Spec:
    protocol: dict[str, Any]
    webhook: list[Case]
    mcp: list[Case]
    # A webhook reader's cases (``reader.py``).
    reader: list[Case] = field(default_factory=list)


def _case(raw: dict[str, Any]) -> Case:
    return Case(
        id=raw["id"],
        title=raw["title"],
        required=bool(raw["required"]),
        harmless=bool(raw["harmless"]),
        send=dict(raw.get("send", {})),
        expect=dict(raw.get("expect", {})),
        state=raw.get("state"),
        tls=bool(raw.get("tls", False)),
        repeat=bool(raw.get("repeat", False)),
        latency=bool(raw.get("latency", False)),
    )


def load(path: Path = CASES_FILE) -> Spec:
    data = json.loads(path.read_text(encoding="utf-8"))
    return Spec(
        protocol=data["protocol"],
        webhook=[_case(raw) for raw in data["webhook"]],
        mcp=[_case(raw) for raw in data["mcp"]],
        reader=[_case(raw) for raw in data.get("reader", [])],
    )


def status_matches(status: int, tokens: list[Any]) -> bool:
    """Whether an HTTP status is one of ``tokens``: numbers, ``"2xx"``-style classes or ``"any"``."""
    for token in tokens:
        if token == "any" or (isinstance(token, int) and status == token):
            return True
        is_class = isinstance(token, str) and len(token) == 3 and token.endswith("xx") and token[0].isdigit()
        if is_class and status // 100 == int(token[0]):
            return True
    return False
