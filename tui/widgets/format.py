"""Bars, sparklines, error text and text from hosts for the dashboard (numbers are written by
``supervisor.display``).

Text from hosts is data: every snapshot the dashboard renders passes :func:`shown` (control
characters and escape sequences written as ``\\x1b``, secrets masked by value) and a string
put in a Rich table passes :func:`plain` (a ``Text``, never parsed as markup)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec
from rich.text import Text

from supervisor.display import escape_control
from supervisor.errors import RunwatchError
from supervisor.secrets import mask_registered

T = TypeVar("T")

_KEPT_FIELDS = frozenset(("identity",))
"""Fields :func:`shown` leaves as they are: a process's identity is what a kill checks on the
host, never shown as such (its argv is shown through ``argv_masked``)."""


def host_text(text: str) -> str:
    """``text`` from a host as shown: secrets masked by value, control characters escaped."""
    return escape_control(mask_registered(text))


def plain(text: str, style: str = "") -> Text:
    """``text`` from a host as a Rich ``Text``: shown as :func:`host_text`, never as markup."""
    return Text(host_text(text), style=style)


def shown(value: T) -> T:
    """``value`` (a snapshot, an event, a list of them) with every string shown as
    :func:`host_text`; objects that have nothing to escape are returned as they are."""
    return _shown(value)  # type: ignore[no-any-return]


def _shown(value: Any) -> Any:
    if isinstance(value, str):
        out = host_text(value)
        return value if out == value else out
    if isinstance(value, msgspec.Struct):
        changed = {}
        for name in value.__struct_fields__:
            if name in _KEPT_FIELDS:
                continue
            old = getattr(value, name)
            new = _shown(old)
            if new is not old:
                changed[name] = new
        return msgspec.structs.replace(value, **changed) if changed else value
    if isinstance(value, list):
        items = [_shown(v) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=False)) else value
    if isinstance(value, tuple):
        items = [_shown(v) for v in value]
        return (
            tuple(items) if any(a is not b for a, b in zip(items, value, strict=False)) else value
        )
    if isinstance(value, dict):
        pairs = {_shown(k): _shown(v) for k, v in value.items()}
        same = all(a is b for a, b in zip(pairs.values(), value.values(), strict=False)) and len(
            pairs
        ) == len(value)
        return value if same else pairs
    return value


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
    text = str(e) if isinstance(e, RunwatchError) else f"{type(e).__name__}: {e}"
    return host_text(text)
