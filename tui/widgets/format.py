"""Bars, sparklines and error text for the dashboard (numbers are written by
``supervisor.display``)."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.errors import RunwatchError

_SPARK = "▁▂▃▄▅▆▇█"
_FULL = "█"
_EMPTY = "░"
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar ``width`` cells wide, with eighth-cell resolution, capped at full."""
    if fraction is None or width <= 0:
        return " " * max(width, 0)
    f = min(max(fraction, 0.0), 1.0)
    eighths = round(f * width * 8)
    full, rest = divmod(eighths, 8)
    text = _FULL * full
    if full < width:
        text += _EIGHTHS[rest] if rest else _EMPTY
        text += _EMPTY * (width - full - 1)
    return text


def sparkline(values: Sequence[float], width: int) -> str:
    """The last ``width`` values as block characters scaled to their own maximum."""
    tail = list(values)[-width:] if width > 0 else []
    if not tail:
        return ""
    top = max(tail)
    if top <= 0:
        return _SPARK[0] * len(tail)
    last = len(_SPARK) - 1
    return "".join(_SPARK[min(last, int(v / top * last + 0.5))] if v > 0 else " " for v in tail)


def error_text(e: BaseException) -> str:
    """An error as shown in a dialog: runwatch's own with its hint, others with their type."""
    return str(e) if isinstance(e, RunwatchError) else f"{type(e).__name__}: {e}"
