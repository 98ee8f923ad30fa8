"""docs/OPERATIONS.md's audit stream examples are what the code sends and what a SIEM verifies:
the HEC example's chain head verifies with the documented key, and fails with another."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from recovery.audit_stream import records

DOC = Path(__file__).resolve().parent.parent / "docs" / "OPERATIONS.md"


def _hec_example() -> list[dict]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Audit stream") :]
    lines = [line for line in section.splitlines() if line.startswith('{"time":')]
    messages = [records.parse_message(line) for line in lines]
    return [m for m in messages if m is not None]


def test_the_documented_example_verifies_with_its_key_only() -> None:
    messages = _hec_example()
    assert [m["type"] for m in messages] == ["audit_event", "chain_head"]
    report = records.verify_stream(messages, b"example-key")
    assert report.problems == [] and report.heads_verified == {"acme": 1}
    assert records.verify_stream(messages, b"another-key").problems != []
    # The documented algorithm, spelled out as the doc spells it.
    event, head = messages
    text = "\n".join(
        ["saga-audit-head:v1", head["tenant"], str(head["position"]), head["head"], head["time"]]
    )
    assert hmac.new(b"example-key", text.encode(), hashlib.sha256).hexdigest() == head["signature"]
    assert hashlib.sha256(("0" * 64 + "." + event["hash"]).encode()).hexdigest() == head["head"]


def test_the_documented_syslog_lines_are_what_the_code_frames() -> None:
    text = DOC.read_text(encoding="utf-8")
    documented = [line for line in text.splitlines() if " <110>1 " in line]
    event, head = _hec_example()
    for line, message in zip(documented, (event, head), strict=True):
        framed = records.syslog_frame(message, hostname="saga-worker-1").decode()
        assert line.replace("<BOM>", "\ufeff") == framed
