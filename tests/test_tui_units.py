"""The pure parts of the app: number formatting."""

from __future__ import annotations

import pytest

from tui.widgets.format import bar, duration, eta, human, memory_mb, percent, rate, sparkline


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "-"),
        (0, "0"),
        (9_999, "9,999"),
        (10_712_345, "10.7 M"),
        (10_000_000, "10 M"),
        (150_000, "150 k"),
        (2_500_000_000, "2.5 G"),
        (-14_000_000, "-14 M"),
    ],
)
def test_human(value: float | None, text: str) -> None:
    assert human(value) == text


def test_human_compact_and_rates() -> None:
    assert human(10_712_345, compact=True) == "10.7M"
    assert rate(None) == "-"
    assert rate(0.2049) == "0.20"
    assert rate(34.06) == "34.1"
    assert rate(1989.5) == "1,990"
    assert rate(25_000) == "25 k"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (75, "1m15s"), (25_320, "7h02m"), (200_000, "2d07h")],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def test_eta_percent_memory() -> None:
    assert eta(0) == "done"
    assert eta(90) == "1m30s"
    assert percent(1, 3) == "33%"
    assert percent(0, 0) == "-"
    assert memory_mb(812) == "812 MB"
    assert memory_mb(612_000) == "598 GB"


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
