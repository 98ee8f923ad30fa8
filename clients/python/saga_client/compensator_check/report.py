"""The verdicts as a table for a person, or as JSON for CI; and the exit status."""

from __future__ import annotations

import json
from typing import Any

from saga_client.compensator_check.cases import FAIL, NOT_SUPPORTED, PASS
from saga_client.compensator_check.webhook import Result


def _verdict(result: Result) -> str:
    if result.verdict == FAIL and not result.case.required:
        return "warn"
    return result.verdict


def table(results: list[Result]) -> str:
    rows = [("case", "required", "verdict", "status", "detail")]
    for result in results:
        rows.append(
            (
                result.case.id,
                "yes" if result.case.required else "no",
                _verdict(result),
                "" if result.status is None else str(result.status),
                result.detail,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(4)]
        lines.append("  ".join([*cells, row[4]]).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths) + "  ------")
    return "\n".join(lines)


def summary(results: list[Result]) -> str:
    blocking = [r.case.id for r in results if r.blocking]
    passed = sum(1 for r in results if r.verdict == PASS)
    unsupported = [r.case.id for r in results if r.verdict == NOT_SUPPORTED]
    text = f"{passed} of {len(results)} cases passed"
    if unsupported:
        text += f"; not supported: {', '.join(unsupported)}"
    if blocking:
        return f"FAILED: {text}; required cases that did not pass: {', '.join(blocking)}"
    return f"OK: {text}; every required case passed"


def as_json(results: list[Result]) -> str:
    data: dict[str, Any] = {
        "ok": not any(r.blocking for r in results),
        "cases": [
            {
                "id": r.case.id,
                "title": r.case.title,
                "required": r.case.required,
                "verdict": r.verdict,
                "status": r.status,
                "detail": r.detail,
                "seconds": [round(s, 4) for s in r.seconds],
            }
            for r in results
        ],
    }
    return json.dumps(data, indent=2)


def exit_status(results: list[Result]) -> int:
    return 1 if any(r.blocking for r in results) else 0
