"""The command group: ``runwatch --help`` lists every command, and a command's module is imported
only when that command runs (``supervisor.cli.LazyGroup``)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
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


def _completion(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The console script asked for shell completion, as the shell asks (``prog_name`` runwatch)."""
    code = "import sys\nsys.argv = ['runwatch']\nimport tui.cli\ntui.cli.main()\n"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_shell_completion_prints_its_script_and_completes_commands() -> None:
    # click writes the completion script as bytes: the masking stdout takes those too.
    source = _completion({"_RUNWATCH_COMPLETE": "bash_source"})
    assert source.returncode == 0, source.stderr
    assert "Traceback" not in source.stderr, source.stderr
    assert "_runwatch_completion()" in source.stdout and "complete -o" in source.stdout
    done = _completion(
        {"_RUNWATCH_COMPLETE": "bash_complete", "COMP_WORDS": "runwatch sta", "COMP_CWORD": "1"}
    )
    assert done.returncode == 0, done.stderr
    assert "plain,status" in done.stdout.splitlines(), done.stdout


def test_bytes_written_to_the_masked_stdout_are_masked_as_text() -> None:
    from supervisor.agent.masking import register
    from supervisor.cli._common import SafeStream

    secret = "sk-bytes-path-0123456789abcdef"
    register([secret])
    out = io.StringIO()
    click.echo(f"key {secret}\x1b[2J".encode(), file=SafeStream(out), nl=False)  # type: ignore[arg-type]
    assert secret not in out.getvalue() and "\x1b" not in out.getvalue(), out.getvalue()
    assert out.getvalue().startswith("key ")
