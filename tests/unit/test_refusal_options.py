"""Refusals name options that exist (row A14 of ``docs/reliability.md``): every command a
message recommends, ``runwatch CMD ... --opt``, is a command of the CLI that takes ``--opt``;
and every ``pass --opt`` of a start's refusals (shown under ``launch`` and ``restart`` alike)
is an option of both."""

from __future__ import annotations

import re
from pathlib import Path

import click

from supervisor.cli import LAZY_COMMANDS, cli

SOURCES = sorted((Path(__file__).resolve().parents[2] / "supervisor").rglob("*.py"))
RECOMMENDED = re.compile(r"runwatch (?:-c \S+ )?([a-z][\w-]*)((?: [^`\"\n]*)?)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
STARTS = ("steps.py", "gate.py", "plan.py", "argcheck.py", "flagcheck.py", "snapshots.py")


def _options(name: str) -> set[str]:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    params = command.get_params(click.Context(command, info_name=name))
    return {o for p in params for o in (*p.opts, *p.secondary_opts)}


def test_a14_every_option_a_refusal_recommends_exists() -> None:
    seen = 0
    wrong = []
    for path in SOURCES:
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            for m in RECOMMENDED.finditer(line):
                name, rest = m.group(1), m.group(2)
                if name not in LAZY_COMMANDS:
                    continue
                opts = _options(name)
                for opt in OPTION.findall(rest.split("`")[0]):
                    seen += 1
                    if opt not in opts:
                        wrong.append(f"{path.name}:{line_no}: runwatch {name} has no {opt}")
    assert seen > 10  # the walk found the recommendations
    passed = set()
    for path in SOURCES:
        if path.name not in STARTS:
            continue
        for opt in re.findall(r"pass (--[a-z][\w-]*)", path.read_text()):
            passed.add(opt)
    assert {"--allow-change", "--force"} <= passed
    for name in ("launch", "restart"):
        wrong += [f"runwatch {name} has no {o}" for o in sorted(passed - _options(name))]
    assert wrong == []
