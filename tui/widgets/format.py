"""Turning model numbers into short, aligned text. Display only: no value is computed here."""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.errors import RunwatchError

_SPARK = "▁▂▃▄▅▆▇█"
_FULL = "█"
_EMPTY = "░"
_EIGHTHS = " ▏▎▍▌▋▊▉"


def human(n: float | int | None, *, unit: str = "", compact: bool = False) -> str:
    """``10712345`` -> ``10.7 M`` (``10.7M`` when compact); ``None`` -> ``-``.

    Numbers below 10,000 are written out.
    """
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    a = abs(n)
    gap = "" if compact else " "
    suffix = f"{gap}{unit}" if unit else ""
    if a < 10_000:
        return f"{sign}{a:,.0f}{suffix}" if float(a).is_integer() else f"{sign}{a:.1f}{suffix}"
    for scale, letter in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= scale:
            value = a / scale
            text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
            return f"{sign}{text.removesuffix('.0')}{gap}{letter}{unit}"
    return f"{sign}{a:.0f}{suffix}"  # pragma: no cover - unreachable


def rate(per_s: float | None) -> str:
    """A per-second rate with enough digits to see it move: ``0.21``, ``12.4``, ``1.2 k``."""
    if per_s is None:
        return "-"
    if per_s < 1:
        return f"{per_s:.2f}"
    if per_s < 100:
        return f"{per_s:.1f}"
    if per_s < 10_000:
        return f"{per_s:,.0f}"
    return human(per_s)


def duration(seconds: float | None) -> str:
    """``25320`` -> ``7h02m``; ``75`` -> ``1m15s``; ``None`` -> ``-``."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def percent(part: int, whole: int) -> str:
    """A share as ``12%`` (``-`` when there is nothing to share)."""
    if whole <= 0:
        return "-"
    return f"{100 * part / whole:.0f}%"


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


def ago(now: float, then: float | None) -> str:
    """``3m12s ago``; ``never`` when there is no time."""
    if then is None:
        return "never"
    return f"{duration(now - then)} ago"


def memory_mb(mb: float | None) -> str:
    """``612000`` -> ``598 GB``; ``812`` -> ``812 MB``."""
    if mb is None:
        return "-"
    if mb >= 1024:
        gb = mb / 1024
        return f"{gb:.1f} GB" if gb < 10 else f"{gb:.0f} GB"
    return f"{mb:.0f} MB"


def eta(seconds: float | None) -> str:
    """Time left: ``done`` at zero, else as :func:`duration`."""
    if seconds is not None and seconds <= 0:
        return "done"
    return duration(seconds)


def error_text(e: BaseException) -> str:
    """An error as shown in a dialog: runwatch's own with its hint, others with their type."""
    return str(e) if isinstance(e, RunwatchError) else f"{type(e).__name__}: {e}"
