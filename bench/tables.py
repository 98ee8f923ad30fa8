"""The report's table conventions, shared by every phase's section: the one table's columns and
its rows (a load's measured columns, or a row saying it was not measured), the ratio to the
machine's limit (min(L1, L2) at a client count), numbers as the report spells them, and the
terminal's and Markdown's tables."""

from __future__ import annotations

from typing import Any

from bench.procs import procfile_lines

HEADER = [
    "figure",
    "clients",
    "throughput /s",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "errors",
    "server CPU ms/req",
    "ratio / note",
]


def load_row(label: str, entry: dict[str, Any], note: str) -> list[str]:
    """One row of a load table: the measured columns of ``entry``, then ``note``."""
    return [
        label,
        fmt(entry.get("clients")),
        fmt(entry.get("throughput")),
        fmt(entry.get("p50_ms"), 2),
        fmt(entry.get("p95_ms"), 2),
        fmt(entry.get("p99_ms"), 2),
        fmt(entry.get("errors")),
        fmt(entry.get("server_cpu_ms_per_request"), 2),
        note,
    ]


def fmt(value: Any, digits: int = 1) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def ratio_of(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def measured_row(label: str, entry: dict[str, Any] | None, limit: float | None = None) -> list[str]:
    """A load table's row for ``entry`` with its throughput's ratio to ``limit``, or a row saying
    it was not measured."""
    if not entry:
        return [label, "–", "not measured", "–", "–", "–", "–", "–", "–"]
    ratio = ratio_of(entry.get("throughput"), limit)
    return load_row(label, entry, f"{ratio:.0%}" if ratio is not None else "–")


def machine_limit(base: dict[str, Any], n: int) -> float | None:
    values = [base.get(f"L1_{n}", {}).get("throughput"), base.get(f"L2_{n}", {}).get("throughput")]
    values = [v for v in values if v]
    return min(values) if values else None


def text_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([line, "-" * len(line), *body])


def md_table(rows: list[list[str]], header: list[str]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return "\n".join(
        [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in esc],
        ]
    )


def mark(met: bool | None) -> str:
    return "met" if met else ("not measured" if met is None else "MISSED")


def short_sql(sql: str) -> str:
    return " ".join(sql.split())[:300].replace("`", "'")


def procfile_line(name: str, results: dict[str, Any] | None = None) -> str:
    """The Procfile's line as the run measured it (kept in its results), else as it is now."""
    measured = (results or {}).get("procfile") or procfile_lines()
    return str(measured.get(name, "?"))
