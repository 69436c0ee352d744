"""One reader of argv flags (``supervisor.agent.argflags``), used by the host and the laptop: its
rules, the readers built on it agreeing on the same command lines, and no second rule or second
list of default scripts anywhere else."""

from __future__ import annotations

import ast
import re
import unicodedata
from pathlib import Path

import pytest

from supervisor import argv as overrides
from supervisor import clients
from supervisor.agent import argflags, match
from supervisor.agent.argflags import flag_map, has_flag, is_option, options, value, values
from supervisor.config import ClientFlagNames, ClientProfile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("arg", "option"),
    [
        ("--model", True),
        ("--model=x", True),
        ("-m", True),
        ("-", True),
        ("--", True),
        ("-1", False),
        ("-0.5", False),
        ("-3e4", False),
        ("value", False),
        ("", False),
    ],
)
def test_an_option_starts_with_a_dash_unless_it_is_a_negative_number(
    arg: str, option: bool
) -> None:
    assert is_option(arg) is option


def test_options_and_their_values() -> None:
    args = ["script.py", "--a", "1", "2", "--b=x=y", "z", "--c", "-5", "-m", "--d"]
    assert options(args) == [
        ("--a", ["1", "2"]),
        ("--b", ["x=y"]),  # after --b=...: z is no option's value
        ("--c", ["-5"]),
        ("-m", []),
        ("--d", []),
    ]


def test_the_last_occurrence_wins() -> None:
    args = ["--max-samples", "5", "--token-budget=10", "--max-samples", "7"]
    assert value(args, "--max-samples") == "7"
    assert value(args, "--token-budget") == "10"
    assert value(args, "--concurrency") is None
    assert values(["--n", "1", "--num", "2"], ["--n", "--num"]) == ["2"]


def test_a_flag_without_value_is_given_but_has_none() -> None:
    args = ["--resume", "--temperature", "-0.5"]
    assert has_flag(args, ["--resume"]) and values(args, ["--resume"]) == []
    assert value(args, "--resume") is None
    assert value(args, "--temperature") == "-0.5"
    assert not has_flag(args, ["--res"])
    assert flag_map(args) == {"--resume": True, "--temperature": "-0.5"}


def test_an_option_after_a_flag_is_not_its_value() -> None:
    assert value(["--datasets", "--resume"], "--datasets") is None


def _profile() -> ClientProfile:
    return ClientProfile(
        name="p",
        scripts=["gen.py"],
        flags=ClientFlagNames(datasets=["--datasets"], samples=["--max-samples", "-n"]),
    )


NEGATIVE = ["python", "gen.py", "--datasets", "a,b", "--shift", "-1", "-n", "-2", "--max-samples=9"]


def test_the_readers_of_both_sides_agree_on_negative_numbers() -> None:
    """The host's flag parse, the laptop's fingerprint and argv difference all read ``-1`` and
    ``-2`` as values."""
    read = match.parse_flags(NEGATIVE, 1, clients.wire(_profile()))
    assert read["datasets"] == ["a", "b"] and read["max_samples"] == 9
    fp = clients.fingerprint_flags(_profile(), NEGATIVE, ["gen.py"])
    assert fp == {"--datasets": "a,b", "--shift": "-1", "--max-samples": "9"}
    diff = overrides.argv_diff(NEGATIVE, [*NEGATIVE[:5], "-3", *NEGATIVE[6:]])
    assert diff == [{"flag": "--shift", "old": "-1", "new": "-3"}]
    changed = overrides.apply_overrides(NEGATIVE, [("--shift", "-4")])
    assert changed[changed.index("--shift") + 1] == "-4"
    assert overrides.remove_flags(NEGATIVE, ["--shift"])[4:6] == ["-n", "-2"]


# --------------------------------------------------------------------------- one of each


def _sources() -> list[Path]:
    return [p for top in ("supervisor", "tui") for p in sorted((ROOT / top).rglob("*.py"))]


def test_default_scripts_are_defined_once() -> None:
    defined = [
        str(path.relative_to(ROOT))
        for path in _sources()
        # Only a file that has the name (identifiers read NFKC-normalised) can assign it: the
        # others are not parsed.
        if "DEFAULT_SCRIPTS" in unicodedata.normalize("NFKC", text := path.read_text())
        for node in ast.walk(ast.parse(text))
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and any(
            isinstance(t, ast.Name) and t.id == "DEFAULT_SCRIPTS"
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    assert defined == ["supervisor/agent/argflags.py"]


NEGATIVE_RULES = re.compile(r"\^-\\d|\[0\] == \"-\" and \w+\[1\]\.isdigit\(\)")
"""How a negative-number rule has been written (a regex ``^-\\d``, a first-character test)."""


def test_the_negative_number_rule_is_written_once() -> None:
    found = [
        str(path.relative_to(ROOT))
        for path in _sources()
        if NEGATIVE_RULES.search(path.read_text())
    ]
    assert found == ["supervisor/agent/argflags.py"]
    assert argflags.__doc__ and "negative number" in argflags.__doc__
