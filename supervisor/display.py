"""Numbers as people read them: the one place the CLI and the dashboard turn figures into text.

Every function is pure and takes ``None`` for "not known", which prints as ``-`` (:data:`UNKNOWN`).
One style throughout:

- counts: ``2,912`` written out, or ``52.3 k`` / ``10.7 M`` compact (one decimal below 100 of a
  unit, none from 100 up, a trailing ``.0`` dropped, so a 50,000 budget is ``50 k``);
- durations: ``45 s``, ``19 min``, ``7 h 02 min``, ``11 h``, ``2 d 03 h``, ``12 d``;
- money: ``$86``, ``$1.20``, ``$0.004``;
- rates: ``0.42``, ``12.4``, ``1,990``, ``25.1 k`` with an optional unit (``tok/s``, ``req/s``);
- sizes: ``812 MB``, ``38.8 MB``, ``1.0 GB`` (binary multiples, as ``free`` and ``top`` print);
- shares: ``54%``;
- text cut to fit (command lines, paths): ends in ``…`` (:func:`shorten`);
- text from hosts (argv, process and file names, log lines, ``/metrics``, Slurm fields): control
  characters and escape sequences shown escaped, ``\\x1b`` (:func:`escape_control`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

UNKNOWN = "-"
"""What every function prints for ``None``."""
ELLIPSIS = "…"
"""Ends a text cut to fit (:func:`shorten`): a cut never looks like the end."""

_COMPACT_UNITS = ("", "k", "M", "G", "T")
_SIZE_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(m: re.Match[str]) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_LINE_BREAKING = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _bash_escape(m: re.Match[str]) -> str:
    # Inside $'...': \xHH is one byte, \uHHHH one character (its UTF-8 bytes).
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def command_line(argv: Sequence[str]) -> str:
    r"""``argv`` as one line a shell reads back: each item quoted as ``shlex.quote`` does, and
    an item holding a control character (a newline, an escape) in bash's ``$'...'`` form, so
    that no item can start a line of its own or change the terminal.

    >>> command_line(["run.py", "--tag", "a b", "x\nFAKE"])
    "run.py --tag 'a b' $'x\\nFAKE'"
    """
    import shlex

    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    out = []
    for item in argv:
        if not _LINE_BREAKING.search(item):
            out.append(shlex.quote(item))
            continue
        body = item.replace("\\", "\\\\").replace("'", "\\'")
        body = _LINE_BREAKING.sub(lambda m: named.get(m.group(0)) or _bash_escape(m), body)
        out.append(f"$'{body}'")
    return " ".join(out)


def escape_control(text: str) -> str:
    r"""``text`` with its control characters (all but tab and newline), escape sequences and
    bidirectional overrides written as escapes, so that text from a host is shown as data and
    never changes the terminal (its title, colours, cursor) or reorders what is shown.

    >>> escape_control("ok\x1b]0;owned\x07 done")
    'ok\\x1b]0;owned\\x07 done'
    >>> escape_control("a\tb\nc\rd")
    'a\tb\nc\\x0dd'
    """
    return _CONTROL.sub(_escaped, text)


def count(n: float | None) -> str:
    """A count written out with thousands separators, rounded to a whole number.

    >>> count(2912)
    '2,912'
    >>> count(10_712_345)
    '10,712,345'
    >>> count(None)
    '-'
    """
    if n is None:
        return UNKNOWN
    return f"{round(n):,d}"


def compact(n: float | None) -> str:
    """A count in at most four significant characters and a unit letter (``k``, ``M``, ``G``,
    ``T``): one decimal below 100 of the unit, none from 100 up, a trailing ``.0`` dropped.
    Below 1,000 the whole number. A value that rounds up to 1,000 of a unit moves to the next
    unit (``999,960`` is ``1 M``, never ``1000 k``).

    >>> compact(950)
    '950'
    >>> compact(52_315)
    '52.3 k'
    >>> compact(50_000)
    '50 k'
    >>> compact(239_700)
    '240 k'
    >>> compact(10_700_000)
    '10.7 M'
    >>> compact(None)
    '-'
    """
    if n is None:
        return UNKNOWN
    sign = "-" if n < 0 else ""
    a = abs(float(n))
    if round(a) < 1000:
        return f"{sign}{round(a):d}"
    unit = 0
    while unit < len(_COMPACT_UNITS) - 1 and a >= 1000:
        a /= 1000
        unit += 1
    text = _short(a)
    if text == "1000" and unit < len(_COMPACT_UNITS) - 1:
        text, unit = "1", unit + 1
    return f"{sign}{text} {_COMPACT_UNITS[unit]}"


def _short(x: float) -> str:
    """``x`` (>= 0) with one decimal below 100, none from 100 up, ``.0`` dropped."""
    text = f"{x:.1f}"
    if float(text) >= 100:
        text = f"{x:.0f}"
    return text.removesuffix(".0")


def budget(used: float | None, limit: float | None) -> str:
    """Tokens used against a budget, both compact; only the tokens when there is no budget.

    >>> budget(54_600, 50_000)
    '54.6 k / 50 k'
    >>> budget(54_600, None)
    '54.6 k'
    """
    if limit is None:
        return compact(used)
    return f"{compact(used)} / {compact(limit)}"


def duration(seconds: float | None) -> str:
    """A length of time to about two significant digits: two units below 10 of the larger one
    (``7 h 02 min``, ``2 d 03 h``), one from 10 up (``11 h``, ``12 d``), rounded to the nearest
    of the last unit shown; a zero second unit is left out. Negative values print as ``0 s``.
    At most 10 characters.

    >>> duration(45)
    '45 s'
    >>> duration(19 * 60 + 20)
    '19 min'
    >>> duration(7 * 3600)
    '7 h'
    >>> duration(7 * 3600 + 2 * 60)
    '7 h 02 min'
    >>> duration(11 * 3600 + 7 * 60)
    '11 h'
    >>> duration(2 * 86400 + 3 * 3600)
    '2 d 03 h'
    >>> duration(None)
    '-'
    """
    if seconds is None:
        return UNKNOWN
    s = round(seconds) if math.isfinite(seconds) and seconds > 0 else 0
    if s < 60:
        return f"{s} s"
    m = round(s / 60)
    if m < 60:
        return f"{m} min"
    if m < 600:
        h, m = divmod(m, 60)
        return f"{h} h {m:02d} min" if m else f"{h} h"
    hours = round(s / 3600)
    if hours < 24:
        return f"{hours} h"
    d, h = divmod(hours, 24)
    if d < 10:
        return f"{d} d {h:02d} h" if h else f"{d} d"
    return f"{round(s / 86400)} d"


def eta(seconds: float | None) -> str:
    """Time left: ``done`` at zero or below, else as :func:`duration`.

    >>> eta(0)
    'done'
    >>> eta(150)
    '2 min'
    """
    if seconds is not None and seconds <= 0:
        return "done"
    return duration(seconds)


def ago(now: float, then: float | None) -> str:
    """How long ago ``then`` was, as :func:`duration`; ``never`` without a time.

    >>> ago(1000.0, 808.0)
    '3 min ago'
    >>> ago(1000.0, None)
    'never'
    """
    if then is None:
        return "never"
    return f"{duration(now - then)} ago"


def latency(ms: float | None) -> str:
    """A short time given in milliseconds (a latency, a wait): ``ms`` below a second, seconds
    above.

    >>> latency(4.24)
    '4.2 ms'
    >>> latency(870.2)
    '870 ms'
    >>> latency(2170)
    '2.17 s'
    >>> latency(51_480)
    '51.5 s'
    """
    if ms is None:
        return UNKNOWN
    if ms >= 10_000:
        return f"{ms / 1000:.1f} s"
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def duration_pm(seconds: float | None, err: float | None) -> str:
    """A duration and its uncertainty, in the unit of the duration where both fit it.

    >>> duration_pm(24 * 60, 3 * 60)
    '24 ± 3 min'
    >>> duration_pm(45, 4)
    '45 ± 4 s'
    >>> duration_pm(7 * 3600 + 2 * 60, 40 * 60)
    '7 h 02 min ± 40 min'
    >>> duration_pm(90, 4)
    '90 ± 4 s'
    >>> duration_pm(90, None)
    '2 min'

    An uncertainty under half a minute is given in seconds while the duration is under 10 min,
    never rounded up to a minute as large as the duration itself (``1 ± 1 min``).
    """
    if seconds is None or err is None:
        return duration(seconds)
    s, e = max(0.0, seconds), max(0.0, err)
    if (s < 60 and e < 60) or (s < 600 and e < 30):
        return f"{round(s)} ± {max(1, round(e))} s"
    if s < 3600 and e < 3600:
        return f"{round(s / 60)} ± {max(1, round(e / 60))} min"
    return f"{duration(s)} ± {duration(max(60.0, e))}"


def money(usd: float | None) -> str:
    """US dollars: whole dollars from $10, cents from $0.10, two significant digits below
    (so a small sum is never rounded to zero), trailing zeros of those dropped.

    >>> money(86.4)
    '$86'
    >>> money(1.2)
    '$1.20'
    >>> money(0.004)
    '$0.004'
    >>> money(0.0085)
    '$0.0085'
    >>> money(None)
    '-'
    """
    if usd is None:
        return UNKNOWN
    sign = "-" if usd < 0 else ""
    a = abs(usd)
    if a >= 9.995:
        return f"{sign}${a:,.0f}"
    if a >= 0.0995 or a == 0:
        return f"{sign}${a:.2f}"
    digits = 1 - math.floor(math.log10(a))
    text = f"{a:.{digits}f}".rstrip("0")
    return f"{sign}${text}"


def rate(per_s: float | None, unit: str = "") -> str:
    """A per-second rate with enough digits to see it move, and ``unit`` after a space.

    >>> rate(0.2049)
    '0.20'
    >>> rate(34.06, "tok/s")
    '34.1 tok/s'
    >>> rate(1989.5)
    '1,990'
    >>> rate(25_060, "tok/s")
    '25.1 k tok/s'
    >>> rate(None, "req/s")
    '-'
    >>> rate(0.0, "tok/s")
    '0 tok/s'
    """
    if per_s is None:
        return UNKNOWN
    a = abs(per_s)
    if per_s == 0:
        text = "0"  # exactly nothing (a finished dataset), not a rate measured to 0.00
    elif a < 0.995:
        text = f"{per_s:.2f}"
    elif a < 99.95:
        text = f"{per_s:.1f}"
    elif a < 9999.5:
        text = f"{per_s:,.0f}"
    else:
        text = compact(per_s)
    return f"{text} {unit}" if unit else text


def rate_pm(per_s: float | None, err: float | None, unit: str = "") -> str:
    """A rate and its uncertainty, both to the precision :func:`rate` gives the rate.

    >>> rate_pm(2160.4, 96.3, "tok/s")
    '2,160 ± 96 tok/s'
    >>> rate_pm(100, 10)
    '100 ± 10'
    >>> rate_pm(34.06, 2.44)
    '34.1 ± 2.4'
    >>> rate_pm(34.06, None, "tok/s")
    '34.1 tok/s'
    """
    text = rate(per_s)
    if per_s is not None and err is not None:
        a = abs(per_s)
        if a < 0.995:
            text += f" ± {err:.2f}"
        elif a < 99.95:
            text += f" ± {err:.1f}"
        elif a < 9999.5:
            text += f" ± {err:,.0f}"
        else:
            text += f" ± {compact(err)}"
    return f"{text} {unit}" if unit and per_s is not None else text


def size(n_bytes: float | None) -> str:
    """A size in bytes with binary multiples: one decimal below 100 of a unit, none above.

    >>> size(512)
    '512 B'
    >>> size(38.8 * 2**20)
    '38.8 MB'
    >>> size(2**30)
    '1.0 GB'
    >>> size(612_000 * 2**20)
    '598 GB'
    """
    if n_bytes is None:
        return UNKNOWN
    a = max(0.0, float(n_bytes))
    if a < 1024:
        return f"{a:.0f} B"
    unit = 0
    while unit < len(_SIZE_UNITS) - 1 and a >= 1024:
        a /= 1024
        unit += 1
    text = f"{a:.1f}"
    if float(text) >= 100:
        text = f"{a:.0f}"
    if text == "1024" and unit < len(_SIZE_UNITS) - 1:
        text, unit = "1.0", unit + 1
    return f"{text} {_SIZE_UNITS[unit]}"


def mebibytes(mb: float | None) -> str:
    """A size given in MiB (as the host reports memory), as :func:`size`.

    >>> mebibytes(812)
    '812 MB'
    >>> mebibytes(None)
    '-'
    """
    return UNKNOWN if mb is None else size(mb * 2**20)


def percent(value: float | None) -> str:
    """A percentage given in percent (``cpu 12%``), to the whole number.

    >>> percent(12.4)
    '12%'
    >>> percent(None)
    '-'
    """
    if value is None:
        return UNKNOWN
    return f"{value:.0f}%"


def share(part: float, whole: float | None) -> str:
    """``part`` as a share of ``whole``; ``-`` when there is nothing to share.

    >>> share(1, 3)
    '33%'
    >>> share(54_600, 50_000)
    '109%'
    >>> share(0, 0)
    '-'
    """
    if not whole or whole <= 0:
        return UNKNOWN
    return percent(100 * part / whole)


def signed_percent(fraction: float | None) -> str:
    """A relative difference with its sign and one decimal.

    >>> signed_percent(0.0123)
    '+1.2%'
    >>> signed_percent(-0.05)
    '-5.0%'
    """
    if fraction is None:
        return UNKNOWN
    return f"{fraction * 100:+.1f}%"


def provisional(n: float | None) -> str:
    """A count known only roughly yet (lines before records are parsed): ``~`` before it.

    >>> provisional(2912)
    '~2,912'
    """
    return UNKNOWN if n is None else "~" + count(n)


def scanning(files_done: int, files_total: int, bytes_done: int, bytes_total: int) -> str:
    """How far a first scan is.

    >>> scanning(3, 8, 1288490189, 2147483648)
    'scanning 3/8 files, 1.2 GB of 2.0 GB'
    """
    return f"scanning {files_done}/{files_total} files, {size(bytes_done)} of {size(bytes_total)}"


def shorten(text: str, width: int, lines: int = 1) -> str:
    """``text`` in at most ``lines`` lines of at most ``width`` characters, wrapped at spaces (a
    word longer than a line is split); when it does not fit, the last line ends in ``…``.

    >>> shorten("python3 run_inference.py --datasets B1,B2", 20)
    'python3 run_inferen…'
    >>> print(shorten("python3 run_inference.py --datasets B1,B2 --output-dir out", 26, lines=2))
    python3 run_inference.py
    --datasets B1,B2 --output…
    >>> shorten("short", 20, lines=3)
    'short'
    """
    if width < 1 or lines < 1:
        return ""
    out: list[str] = []
    rest = text
    while len(out) < lines - 1 and len(rest) > width:
        cut = rest.rfind(" ", 0, width + 1)
        if cut <= 0:  # no space to break at: split the word
            cut = width
        out.append(rest[:cut].rstrip(" "))
        rest = rest[cut:].lstrip(" ")
    out.append(rest if len(rest) <= width else rest[: width - 1] + ELLIPSIS)
    return "\n".join(out)


HELD = {
    "cgroup": "held by its cgroup",
    "token": "held by its launch token",
    "adopted": "adopted (started outside runwatch: no unit holds it)",
}


def held(held_by: str | None) -> str:
    """How a run's process is held, in words (``RunView.held_by``; "" for None)."""
    if held_by is None:
        return ""
    return HELD.get(held_by, f"held by {held_by}")
