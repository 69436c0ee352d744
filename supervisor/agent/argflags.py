"""Reading the flags of a command line, one way on the host and on the laptop.

Standard library only, Python >= 3.8 (this module travels to the host with the package; the
laptop imports it too). An argv is a list: values are never split or quoted.

The rules, written once:

- an **option** is an argument that starts with ``-`` (``-m``, ``--model``, ``--model=x``, a
  lone ``-`` too), unless it is a **negative number** (``-`` then a digit: ``-1``, ``-0.5``,
  ``-3e4``) or has a space before any ``=`` (``--extra-args "--api-key K --x 1"``: a command
  line given as one value; argparse reads it as a positional), which are values;
- an option's **values** are ``--f=a`` -> ``[a]``, or the arguments after ``--f`` up to the next
  option (``--f a b`` -> ``[a, b]``; ``--f`` alone -> ``[]``);
- when a flag is given several times, the **last** one counts.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

DEFAULT_SCRIPTS = ("run_inference.py", "regenerate_train_data.py", "server_generate.py")
"""Script names that make a process a run when no ``scripts`` are configured."""

_NEGATIVE_NUMBER = re.compile(r"^-\d")


def is_negative_number(arg: str) -> bool:
    """True for ``-1``, ``-0.5``, ``-3e4``: a value, not an option."""
    return _NEGATIVE_NUMBER.match(arg) is not None


def is_option(arg: str) -> bool:
    """True when ``arg`` is an option (``-x``, ``--flag``, ``--flag=v``), not a value (a
    negative number, a command line: ``--api-key K --x 1``)."""
    if not arg.startswith("-") or is_negative_number(arg):
        return False
    name = arg.partition("=")[0]
    return not any(c.isspace() for c in name)


def options(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Each option of ``args`` in order, with its values: ``("--f", ["a"])`` for ``--f=a``,
    ``("--f", ["a", "b"])`` for ``--f a b``, ``("--f", [])`` for ``--f`` alone. Arguments before
    the first option, and after an option written ``--f=a``, are no option's values."""
    out: list[tuple[str, list[str]]] = []
    taking: list[str] | None = None
    """The values of the last option while the arguments after it are its values."""
    for arg in args:
        if is_option(arg):
            name, eq, given = arg.partition("=")
            vals = [given] if eq else []
            out.append((name, vals))
            taking = None if eq else vals
        elif taking is not None:
            taking.append(arg)
    return out


def values(args: Sequence[str], names: Iterable[str]) -> list[str] | None:
    """The values of the last occurrence of any of ``names`` (``[]``: given without value; None:
    absent)."""
    wanted = set(names)
    found: list[str] | None = None
    for name, vals in options(args):
        if name in wanted:
            found = vals
    return found


def value(args: Sequence[str], flag: str) -> str | None:
    """The first value of the last ``flag`` (``--flag VALUE`` or ``--flag=VALUE``), or None."""
    found = values(args, (flag,))
    return found[0] if found else None


def has_flag(args: Sequence[str], names: Iterable[str]) -> bool:
    """True when ``args`` holds one of ``names`` (``--f``, ``--f VALUE`` or ``--f=VALUE``)."""
    return values(args, names) is not None


def flag_map(args: Sequence[str]) -> dict[str, str | bool]:
    """``--name`` -> its first value, or True for a flag without value (the last occurrence
    wins; single-dash options and ``--`` are left out)."""
    return {
        name: vals[0] if vals else True
        for name, vals in options(args)
        if name.startswith("--") and name != "--"
    }
