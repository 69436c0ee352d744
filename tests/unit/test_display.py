"""The one formatting module: each unit by example, and the properties that keep a column honest
(order kept, magnitude kept, no ``0.1 M`` for a value below a million)."""

from __future__ import annotations

import doctest
import re
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor import display

_COMPACT = re.compile(r"^(-?)(\d+(?:\.\d)?)(?: ([kMGT]))?$")
_SCALE = {None: 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _compact_value(text: str) -> float:
    m = _COMPACT.match(text)
    assert m, f"not a compact count: {text!r}"
    value = float(m.group(2)) * _SCALE[m.group(3)]
    return -value if m.group(1) else value


def test_docstring_examples_hold() -> None:
    failed, tried = doctest.testmod(display, optionflags=doctest.ELLIPSIS)
    assert tried >= 40 and failed == 0


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "-"), (0, "0"), (2912, "2,912"), (10_712_345, "10,712,345"), (41.6, "42")],
)
def test_count(n: float | None, text: str) -> None:
    assert display.count(n) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0"),
        (950, "950"),
        (999.4, "999"),
        (999.6, "1 k"),
        (2_500, "2.5 k"),
        (50_000, "50 k"),
        (52_315, "52.3 k"),
        (99_960, "100 k"),
        (150_000, "150 k"),
        (239_700, "240 k"),
        (999_960, "1 M"),
        (10_000_000, "10 M"),
        (10_700_000, "10.7 M"),
        (14_000_000, "14 M"),
        (1_250_000_000, "1.2 G"),
        (2_500_000_000_000, "2.5 T"),
        (-14_000_000, "-14 M"),
    ],
)
def test_compact(n: float | None, text: str) -> None:
    assert display.compact(n) == text


def test_budget() -> None:
    assert display.budget(54_600, 50_000) == "54.6 k / 50 k"
    assert display.budget(10_700_000, 10_000_000) == "10.7 M / 10 M"
    assert display.budget(54_600, None) == "54.6 k"
    assert display.budget(None, 50_000) == "- / 50 k"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (-5, "0 s"),
        (0, "0 s"),
        (45, "45 s"),
        (59.4, "59 s"),
        (59.6, "1 min"),
        (19 * 60 + 29, "19 min"),
        (19 * 60 + 31, "20 min"),
        (3599, "1 h"),
        (25_320, "7 h 02 min"),
        (35_969, "9 h 59 min"),
        (35_970, "10 h"),
        (11 * 3600 + 7 * 60, "11 h"),
        (23 * 3600 + 20 * 60, "23 h"),
        (86_399, "1 d"),
        (2 * 86400 + 3 * 3600 + 59, "2 d 03 h"),
        (10 * 86400 - 1800, "10 d"),
        (12.4 * 86400, "12 d"),
        (float("nan"), "0 s"),
    ],
)
def test_duration(seconds: float | None, text: str) -> None:
    assert display.duration(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "err", "text"),
    [
        # compare's total on the demo: 89.8 ± 3.7 s once printed as "1 ± 1 min".
        (89.8, 3.66, "90 ± 4 s"),
        (200, 20, "200 ± 20 s"),
        (45, 4, "45 ± 4 s"),
        (95, 40, "2 ± 1 min"),
        (1199, 159, "20 ± 3 min"),
        (1199, 10, "20 ± 1 min"),
        (7 * 3600 + 2 * 60, 40 * 60, "7 h 02 min ± 40 min"),
    ],
)
def test_duration_pm_never_rounds_the_error_up_to_the_size_of_the_duration(
    seconds: float, err: float, text: str
) -> None:
    assert display.duration_pm(seconds, err) == text


def test_eta_and_ago() -> None:
    assert display.eta(0) == "done"
    assert display.eta(-1) == "done"
    assert display.eta(None) == "-"
    assert display.eta(150) == "2 min"
    assert display.ago(1000.0, 958.0) == "42 s ago"
    assert display.ago(1000.0, None) == "never"


@pytest.mark.parametrize(
    ("ms", "text"),
    [(None, "-"), (4.24, "4.2 ms"), (870.2, "870 ms"), (2170, "2.17 s"), (51_480, "51.5 s")],
)
def test_latency(ms: float | None, text: str) -> None:
    assert display.latency(ms) == text


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (None, "-"),
        (0.0, "$0.00"),
        (1234.5, "$1,234"),
        (137.4, "$137"),
        (86.4, "$86"),
        (9.8, "$9.80"),
        (9.996, "$10"),
        (1.2, "$1.20"),
        (0.5916, "$0.59"),
        (0.1, "$0.10"),
        (0.04036, "$0.04"),
        (0.0085, "$0.0085"),
        (0.004, "$0.004"),
        (0.000123, "$0.00012"),
    ],
)
def test_money(usd: float | None, text: str) -> None:
    assert display.money(usd) == text


@pytest.mark.parametrize(
    ("per_s", "unit", "text"),
    [
        (None, "", "-"),
        (None, "tok/s", "-"),
        (0.0, "", "0"),
        (0.0, "tok/s", "0 tok/s"),
        (0.004, "", "0.00"),
        (0.2049, "", "0.20"),
        (0.42, "req/s", "0.42 req/s"),
        (34.06, "", "34.1"),
        (292.6, "tok/s", "293 tok/s"),
        (1989.5, "", "1,990"),
        (25_060, "tok/s", "25.1 k tok/s"),
    ],
)
def test_rate(per_s: float | None, unit: str, text: str) -> None:
    assert display.rate(per_s, unit) == text


@pytest.mark.parametrize(
    ("n_bytes", "text"),
    [
        (None, "-"),
        (0, "0 B"),
        (512, "512 B"),
        (1536, "1.5 KB"),
        (38.8 * 2**20, "38.8 MB"),
        (812 * 2**20, "812 MB"),
        (2**30, "1.0 GB"),
        (612_000 * 2**20, "598 GB"),
        (1023.99 * 2**20, "1.0 GB"),
    ],
)
def test_size(n_bytes: float | None, text: str) -> None:
    assert display.size(n_bytes) == text


def test_mebibytes_and_shares() -> None:
    assert display.mebibytes(812) == "812 MB"
    assert display.mebibytes(None) == "-"
    assert display.percent(12.4) == "12%"
    assert display.percent(None) == "-"
    assert display.share(1, 3) == "33%"
    assert display.share(54_600, 50_000) == "109%"
    assert display.share(0, 0) == "-"
    assert display.share(5, None) == "-"
    assert display.signed_percent(0.0123) == "+1.2%"
    assert display.signed_percent(None) == "-"


# --------------------------------------------------------------------------- properties

counts = st.integers(min_value=0, max_value=10**15)


@given(counts)
def test_compact_never_writes_a_smaller_unit_as_a_fraction_of_a_larger_one(n: int) -> None:
    text = display.compact(n)
    number = _COMPACT.match(text)
    assert number is not None
    if number.group(3):
        assert float(number.group(2)) >= 1  # never "0.1 M"
    if n < 999_950:
        assert not text.endswith(("M", "G", "T"))
    assert not text.endswith(".0") and ".0 " not in text


@given(counts)
def test_compact_keeps_the_magnitude(n: int) -> None:
    text = display.compact(n)
    shown = _compact_value(text)
    # Off by at most half the last digit shown: 0.05 of the unit, or 0.5 from 100 of it up.
    number = _COMPACT.match(text)
    assert number is not None
    step = (0.1 if "." in number.group(2) or float(number.group(2)) < 100 else 1.0) * _SCALE[
        number.group(3)
    ]
    assert abs(shown - n) <= max(0.5, step / 2 + 1e-9 * n)


@given(counts, counts)
def test_compact_keeps_the_order(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert _compact_value(display.compact(lo)) <= _compact_value(display.compact(hi))


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_count_round_trips(n: int) -> None:
    assert int(display.count(n).replace(",", "")) == n


def _duration_value(text: str) -> int:
    units = {"s": 1, "min": 60, "h": 3600, "d": 86400}
    parts = text.split()
    return sum(int(v) * units[u] for v, u in zip(parts[::2], parts[1::2], strict=True))


@given(st.floats(min_value=0, max_value=1e9), st.floats(min_value=0, max_value=1e9))
def test_duration_keeps_the_order_and_the_magnitude(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    shown_lo, shown_hi = (
        _duration_value(display.duration(lo)),
        _duration_value(display.duration(hi)),
    )
    assert shown_lo <= shown_hi
    # Off by at most half the last unit shown (and the rounding to whole seconds first).
    text = display.duration(lo)
    unit = {"s": 1, "min": 60, "h": 3600, "d": 86400}[text.split()[-1]]
    assert abs(shown_lo - lo) <= unit / 2 + 0.5
    assert len(text) <= 10


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False))
def test_money_keeps_two_significant_digits(usd: float) -> None:
    text = display.money(usd)
    assert text.startswith("$")
    shown = float(text[1:].replace(",", ""))
    assert abs(shown - usd) <= max(0.005, 0.05 * usd)
    if usd >= 1e-9:
        assert shown > 0  # a small sum is never rounded to nothing


@given(st.floats(min_value=0, max_value=1e18, allow_nan=False))
def test_size_keeps_the_magnitude(n: float) -> None:
    value, unit = display.size(n).split()
    scale = 1024 ** ["B", "KB", "MB", "GB", "TB", "PB"].index(unit)
    step = 0.1 if "." in value else 1.0
    assert abs(float(value) * scale - n) <= max(0.5, step / 2 * scale + 1e-9 * n)  # half a digit
    assert float(value) < 1024


_WORDS = ["python3", "run_inference.py", "--datasets", "B1,B2,B3", "--output-dir", "/data/x" * 9]


@given(
    st.lists(st.sampled_from(_WORDS), max_size=12),
    st.sampled_from([" ", "  "]),
    st.integers(1, 40),
    st.integers(1, 5),
)
def test_shorten_fits_and_marks_every_cut(
    words: list[str], sep: str, width: int, lines: int
) -> None:
    """Every line fits, there are never more than asked, and a cut always ends in an ellipsis:
    what is shown is the text's start, in order, with nothing left out before the ellipsis."""
    text = sep.join(words)
    shown = display.shorten(text, width, lines)
    rows = shown.split("\n")
    assert len(rows) <= lines and all(len(r) <= width for r in rows)
    flat, whole = "".join(shown.removesuffix("…").split()), "".join(text.split())
    assert whole.startswith(flat)
    assert shown.endswith("…") == (len(flat) < len(whole))


def test_shorten_splits_a_word_longer_than_a_line() -> None:
    assert display.shorten("x" * 10, 4, lines=2) == "xxxx\nxxx…"
    assert display.shorten("x" * 8, 4, lines=2) == "xxxx\nxxxx"
    assert display.shorten("abc", 0) == "" and display.shorten("abcdef", 1) == "…"


@pytest.mark.parametrize(
    "argv",
    [
        ["run.py", "--datasets", "B1,B2"],
        ["run.py", "--tag", "a b", "it's"],
        ["run.py", "--tag", "[bold red]MARK[/bold red]\nFAKE LINE", "e\x1b[41mX\x9b2J"],
        ["back\\slash\n", "\t", "\u202eevil", "'", ""],
    ],
)
def test_a_command_line_is_one_line_bash_reads_back_item_for_item(argv: list[str]) -> None:
    """Shown argv never starts a line of its own or carries a raw escape, and pasted into bash
    it is the same argv."""
    line = display.command_line(argv)
    assert "\n" not in line and "\x1b" not in line and "\x9b" not in line
    done = subprocess.run(
        ["bash", "-c", f"printf '%s\\0' {line}"], capture_output=True, timeout=30, check=True
    )
    assert done.stdout.decode().split("\0")[:-1] == argv


def test_how_a_run_is_held_reads_as_words() -> None:
    from supervisor import display

    assert display.held("cgroup") == "held by its cgroup"
    assert display.held("token") == "held by its launch token"
    assert display.held("adopted").startswith("adopted (started outside runwatch")
    assert display.held(None) == ""
