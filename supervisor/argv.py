"""argv flags of a run: ``--set KEY=VALUE`` overrides and the difference between two argvs.

An argv is always a list: values are never split or quoted, so any string stays one argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from supervisor.errors import UsageError

_KEY_RE = re.compile(r"^-{0,2}([A-Za-z0-9][A-Za-z0-9_.\-]*)$")


def show_value(v: Any) -> str:
    """A flag value for humans: ``(absent)`` for None, ``(set)`` for a flag without value."""
    if v is None:
        return "(absent)"
    if v is True:
        return "(set)"
    return str(v)


def parse_sets(values: Iterable[str]) -> list[tuple[str, str]]:
    """``["token-budget=10000000"]`` -> ``[("--token-budget", "10000000")]``."""
    out: list[tuple[str, str]] = []
    for v in values:
        key, eq, value = v.partition("=")
        m = _KEY_RE.match(key.strip())
        if not eq or not m:
            raise UsageError(
                f"--set {v!r}: expected KEY=VALUE",
                "for example --set token-budget=10000000 (becomes --token-budget 10000000)",
            )
        out.append(("--" + m.group(1), value))
    return out


def apply_overrides(argv: Sequence[str], overrides: Iterable[tuple[str, str]]) -> list[str]:
    """argv with each ``(flag, value)`` replacing every ``flag VALUE`` / ``flag=VALUE`` (or added).

    The argv is a list; values are never split or quoted, so any string stays one argument.
    """
    out = list(argv)
    for flag, value in overrides:
        found = False
        i = 0
        while i < len(out):
            arg = out[i]
            if arg == flag and i + 1 < len(out):
                out[i + 1] = value
                found = True
                i += 2
                continue
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                found = True
            i += 1
        if not found:
            out += [flag, value]
    return out


def _flag_map(argv: Sequence[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            if eq:
                flags[name] = value
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                flags[name] = argv[i + 1]
                i += 1
            else:
                flags[name] = True
        i += 1
    return flags


def argv_diff(old: Sequence[str], new: Sequence[str]) -> list[dict[str, Any]]:
    """Flags that differ between two argvs: ``[{"flag", "old", "new"}]`` (None: absent)."""
    a, b = _flag_map(old), _flag_map(new)
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
