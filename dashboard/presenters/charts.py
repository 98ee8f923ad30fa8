"""Server-side SVG bar charts: geometry computed here, drawn by ``_bar_chart.html`` with SVG
attributes and CSS classes only (the CSP forbids inline styles and scripts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infra.durations import duration_short

ROW_HEIGHT = 28
BAR_HEIGHT = 18
LABEL_WIDTH = 170
BAR_AREA = 300
WIDTH = LABEL_WIDTH + BAR_AREA + 70


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    display: str
    y: int
    text_y: int
    width: float
    css: str


@dataclass(frozen=True)
class BarChart:
    bars: list[Bar]
    height: int
    width: int = WIDTH
    label_width: int = LABEL_WIDTH
    value_x_pad: int = 6

    @property
    def empty(self) -> bool:
        return not self.bars or all(bar.value == 0 for bar in self.bars)


def _display(value: float, unit: str) -> str:
    if unit == "s":
        # The one short form, the same the cards beside the chart print.
        return duration_short(value)
    return f"{value:g}"


def bar_chart(
    rows: Sequence[tuple[str, float | None]],
    *,
    css_prefix: str = "",
    keys: Sequence[str] | None = None,
    unit: str = "",
) -> BarChart:
    """Horizontal bars scaled to the largest value; a None value is drawn as "no data", not 0."""
    top = max((value or 0 for _label, value in rows), default=0) or 1
    bars = []
    for i, (label, value) in enumerate(rows):
        key = keys[i] if keys is not None else ""
        y = i * ROW_HEIGHT + (ROW_HEIGHT - BAR_HEIGHT) // 2
        bars.append(
            Bar(
                label=str(label),
                value=value or 0,
                display="no data" if value is None else _display(value, unit),
                y=y,
                text_y=y + BAR_HEIGHT - 5,
                width=round(max((value or 0) / top * BAR_AREA, 2 if value else 0), 1),
                css=f"bar {css_prefix}{key}" if key else "bar",
            )
        )
    return BarChart(bars=bars, height=max(len(bars), 1) * ROW_HEIGHT)
