"""The command group: ``runwatch --help`` lists every command, and a command's module is imported
only when that command runs (``supervisor.cli.LazyGroup``)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import click
import pytest

from supervisor.cli import LAZY_COMMANDS, cli
from tests import fresh
from tests.fixtures_data import make_raw


def _runwatch(*args: str, probe: str = "") -> subprocess.CompletedProcess[str]:
    """The ``runwatch`` console script (``tui.cli:main``) in a process of its own; ``probe``:
    Python run in that process after the command returns."""
    code = (
        "import sys\n"
        f"sys.argv = ['runwatch', *{list(args)!r}]\n"
        "import tui.cli\n"
        "tui.cli.main()\n" + probe
    )
    return fresh.run(code, timeout=120)


def _listed(help_text: str) -> dict[str, str]:
    """Command name -> its short help, as the Commands section of ``--help`` shows them."""
    section = help_text.split("\nCommands:\n", 1)[1]
    listed: dict[str, str] = {}
    name = ""
    for line in section.splitlines():
        found = re.match(r"^  (\S+)\s+(.*)$", line)
        if found:
            name = found.group(1)
            listed[name] = found.group(2).strip()
        elif line.strip() and name:
            listed[name] += " " + line.strip()
    return listed


def test_help_lists_every_command_with_its_whole_short_help() -> None:
    done = _runwatch("--help")
    assert done.returncode == 0, done.stderr
    listed = _listed(done.stdout)
    assert set(listed) == set(LAZY_COMMANDS) | {"tui"}
    for name, (_target, short) in LAZY_COMMANDS.items():
        assert listed[name] == short, name
    assert listed["tui"].startswith("Open the dashboard")


@pytest.mark.parametrize("name", sorted(LAZY_COMMANDS))
def test_the_listed_help_is_the_commands_own(name: str) -> None:
    """The short help kept in LAZY_COMMANDS is the first sentence of the command's docstring."""
    command = cli.get_command(click.Context(cli), name)
    assert isinstance(command, click.Command)
    assert command.name == name
    assert command.get_short_help_str(limit=200) == LAZY_COMMANDS[name][1]


def test_a_lazily_loaded_command_runs_and_loads_no_other_command(tmp_path: Path) -> None:
    data = tmp_path / "B1" / "raw_responses.jsonl"
    data.parent.mkdir()
    truth = make_raw(data, 25, seed=4)
    probe = (
        "import json\n"
        "mods = sorted(m for m in sys.modules if m.startswith('supervisor.cli.'))\n"
        "print(json.dumps(mods))\n"
    )
    done = _runwatch("scan", str(data), "--json", probe=probe)
    assert done.returncode == 0, done.stderr
    result, loaded = done.stdout.strip().splitlines()
    (scanned,) = json.loads(result)["files"]
    truth.check(scanned)
    assert json.loads(loaded) == ["supervisor.cli._common", "supervisor.cli.data"]


def test_an_unknown_command_is_a_usage_error() -> None:
    done = _runwatch("scna")
    assert done.returncode == 2
    assert "No such command 'scna'" in done.stderr
