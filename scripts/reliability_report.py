"""Regenerate the results table in docs/RELIABILITY.md from artifacts/reliability.json.

.venv/bin/pytest tests/reliability        # writes artifacts/reliability.json
python scripts/reliability_report.py      # rewrites the table between the markers
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "artifacts" / "reliability.json"
DOC = ROOT / "docs" / "RELIABILITY.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
HEADLINE = ("faults_injected", "unwinds_completed", "duplicates_observed", "lost_intents", "server_errors")


def table(scenarios: dict[str, dict[str, object]]) -> str:
    rows = [
        "| scenario | faults injected | unwinds completed | duplicates | lost intents | 5xx | other counts "
        "| measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, counts in scenarios.items():
        headline = [str(counts.get(key, "–")) for key in HEADLINE]
        other = ", ".join(f"{k}={v}" for k, v in counts.items() if k not in HEADLINE and k != "measured_at")
        rows.append(f"| {name} | {' | '.join(headline)} | {other} | {counts.get('measured_at', '')} |")
    return "\n".join(rows)


def main() -> int:
    if not RESULTS.exists():
        print(f"{RESULTS} does not exist: run .venv/bin/pytest tests/reliability first", file=sys.stderr)
        return 1
    scenarios = json.loads(RESULTS.read_text())["scenarios"]
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + table(scenarios) + "\n" + doc[end:])
    print(f"updated {DOC.relative_to(ROOT)} from {len(scenarios)} scenarios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
