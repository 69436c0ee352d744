"""argv flags of a run: ``--set KEY=VALUE`` overrides and the difference between two argvs.

An argv is always a list: values are never split or quoted, so any string stays one argument.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from supervisor.agent.argflags import flag_map, is_negative_number, is_option
from supervisor.errors import UsageError

_KEY_RE = re.compile(r"^-{0,2}([A-Za-z0-9][A-Za-z0-9_.\-]*)$")


def show_value(v: Any) -> str:
    """A flag value for humans: ``(absent)`` for None, ``(set)`` for a flag without value."""
    if v is None:
        return "(absent)"
    if v is True:
        return "(set)"
    return str(v)


def parse_sets(values: Iterable[str]) -> list[tuple[str, str | None]]:
    """``["token-budget=10000000", "resume"]`` -> ``[("--token-budget", "10000000"),
    ("--resume", None)]`` (a KEY without ``=`` is a flag without value)."""
    out: list[tuple[str, str | None]] = []
    for v in values:
        key, eq, value = v.partition("=")
        m = _KEY_RE.match(key.strip())
        if not m:
            raise UsageError(
                f"--set {v!r}: expected KEY=VALUE, or KEY for a flag without value",
                "for example --set token-budget=10000000 (becomes --token-budget 10000000), "
                "or --set resume (becomes --resume)",
            )
        out.append(("--" + m.group(1), value if eq else None))
    return out


def parse_unsets(values: Iterable[str]) -> list[str]:
    """``["temperature", "--resume"]`` -> ``["--temperature", "--resume"]``."""
    out: list[str] = []
    for v in values:
        m = _KEY_RE.match(v.strip())
        if not m or "=" in v:
            raise UsageError(
                f"--unset {v!r}: expected a flag name",
                "for example --unset temperature (removes --temperature and its value)",
            )
        out.append("--" + m.group(1))
    return out


def flag_spans(
    args: Sequence[str], flag: str, switches: Collection[str] = ()
) -> list[tuple[int, int]]:
    """``(start, end)`` of each occurrence of ``flag`` in ``args`` with its whole value, read by
    the one option rule (``argflags``): ``--f=v`` alone; ``--f`` and every value after it up to
    the next option (``--datasets B1 B2``), none for a flag in ``switches`` (it takes no value:
    what follows is not its). Nothing after a bare ``--`` is an option."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        if not is_option(arg):
            i += 1
            continue
        name, eq, _ = arg.partition("=")
        j = i + 1
        if not eq and name not in switches:
            while j < len(args) and args[j] != "--" and not is_option(args[j]):
                j += 1
        if name == flag:
            spans.append((i, j))
        i = j
    return spans


def _written(flag: str, value: str | None, joined: bool) -> list[str]:
    """``flag`` with ``value`` as arguments: ``--f``, ``--f v``, or ``--f=v`` when asked, or
    when the value would read as an option (``-x``, ``--y 2``, ``--y=2``)."""
    if value is None:
        return [flag]
    if joined or (value.startswith("-") and not is_negative_number(value)):
        return [f"{flag}={value}"]
    return [flag, value]


def _insert_at(args: Sequence[str]) -> int:
    """Where a new option goes: before a bare ``--`` (after it, it would be a positional)."""
    return list(args).index("--") if "--" in args else len(args)


def apply_overrides(
    argv: Sequence[str],
    overrides: Iterable[tuple[str, str | None]],
    switches: Collection[str] = (),
) -> list[str]:
    """argv with each ``(flag, value)`` replacing the flag's whole value, or added; a value of
    None sets the flag without value (``--resume``).

    Whatever the old value looks like (``--f=v``, ``--f "--y 2"``, several values, the flag
    given several times), it is gone: the first occurrence is replaced, later ones are removed
    (:func:`flag_spans`; ``switches`` take no value, so what follows them stays). The argv is a
    list; values are never split or quoted, so any string stays one argument. A value that
    would read as an option is joined to its flag (``--flag=-x``); a flag written ``--f=v``
    keeps that form.
    """
    out = list(argv)
    for flag, value in overrides:
        spans = flag_spans(out, flag, switches)
        if not spans:
            at = _insert_at(out)
            out[at:at] = _written(flag, value, joined=False)
            continue
        first = spans[0][0]
        joined = "=" in out[first]
        for start, end in reversed(spans[1:]):
            del out[start:end]
        out[first : spans[0][1]] = _written(flag, value, joined)
    return out


def remove_flags(
    argv: Sequence[str], flags: Iterable[str], switches: Collection[str] = ()
) -> list[str]:
    """argv without each of ``flags`` and its whole value, every time it is given
    (:func:`flag_spans`)."""
    args = list(argv)
    # Every span is read on the argv as given: removing one flag never makes what followed it
    # a value of another.
    drop = {i for f in set(flags) for s, e in flag_spans(args, f, switches) for i in range(s, e)}
    return [a for i, a in enumerate(args) if i not in drop]


def argv_diff(old: Sequence[str], new: Sequence[str]) -> list[dict[str, Any]]:
    """Flags that differ between two argvs: ``[{"flag", "old", "new"}]`` (None: absent)."""
    a, b = flag_map(old), flag_map(new)
    diff = [
        {"flag": k, "old": a.get(k), "new": b.get(k)}
        for k in list(a) + [k for k in b if k not in a]
        if a.get(k) != b.get(k)
    ]
    lead_a = [x for x in old if not x.startswith("--")][:2]
    lead_b = [x for x in new if not x.startswith("--")][:2]
    if lead_a != lead_b:
        diff.insert(0, {"flag": "(command)", "old": " ".join(lead_a), "new": " ".join(lead_b)})
    return diff
