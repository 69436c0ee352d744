"""The pure parts of the app: bars and sparklines."""

from __future__ import annotations

from tui.widgets.format import bar, sparkline


def test_bar_is_exact_in_eighths_and_capped() -> None:
    assert bar(0.0, 6) == "░░░░░░"
    assert bar(0.5, 6) == "███░░░"
    assert bar(1 / 48, 6) == "▏░░░░░"
    assert bar(1.07, 6) == "██████"
    assert len(bar(0.33, 10)) == 10


def test_sparkline_scales_to_its_own_maximum() -> None:
    assert sparkline([], 10) == ""
    assert sparkline([0, 0], 10) == "▁▁"
    line = sparkline([1, 2, 4, 8], 10)
    assert line[-1] == "█" and line[0] < line[-1]
    assert len(sparkline(list(range(1, 40)), 14)) == 14
