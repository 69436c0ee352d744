"""argv flags of a run: ``--set KEY=VALUE`` overrides and the difference between two argvs.

An argv is always a list: values are never split or quoted, so any string stays one argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from supervisor.agent.argflags import flag_map, is_option
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


def apply_overrides(argv: Sequence[str], overrides: Iterable[tuple[str, str | None]]) -> list[str]:
    """argv with each ``(flag, value)`` replacing every ``flag VALUE`` / ``flag=VALUE`` (or
    added); a value of None sets the flag without value (``--resume``).

    The argv is a list; values are never split or quoted, so any string stays one argument. A
    value that would read as an option (``-x``, ``--y``) is joined to its flag (``--flag=-x``).
    """
    out = list(argv)
    for flag, value in overrides:
        found = False
        joined = value is not None and is_option(value)
        i = 0
        while i < len(out):
            arg = out[i]
            if arg == flag:
                found = True
                has_value = i + 1 < len(out) and not is_option(out[i + 1])
                if value is None or joined:
                    if has_value:
                        del out[i + 1]
                    if joined:
                        out[i] = f"{flag}={value}"
                elif has_value:
                    out[i + 1] = value
                else:
                    out.insert(i + 1, value)
                i += 1 if value is None or joined else 2
                continue
            if arg.startswith(flag + "="):
                out[i] = flag if value is None else f"{flag}={value}"
                found = True
            i += 1
        if not found:
            if value is None:
                out.append(flag)
            else:
                out += [f"{flag}={value}"] if joined else [flag, value]
    return out


def remove_flags(argv: Sequence[str], flags: Iterable[str]) -> list[str]:
    """argv without each of ``flags`` (``--flag``, ``--flag VALUE``, ``--flag=VALUE``)."""
    drop = set(flags)
    out: list[str] = []
    i = 0
    args = list(argv)
    while i < len(args):
        arg = args[i]
        if arg in drop:
            i += 2 if i + 1 < len(args) and not is_option(args[i + 1]) else 1
            continue
        if arg.partition("=")[0] in drop and "=" in arg:
            i += 1
            continue
        out.append(arg)
        i += 1
    return out


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
