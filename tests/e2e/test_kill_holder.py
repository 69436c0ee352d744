"""Issue 34, "a hand-started process the user names": a process that executes no configured
script (``python -c``, ``python -m run_inference``, a name set by setproctitle) but holds the run's
data file open for append blocks a launch, and the refusal names the command that stops it:
``runwatch kill RUN --pid PID``, which accepts it because the host sees it hold the file (the
kernel's fact, checked again at the kill), and refuses a process that holds none of the run's
files. Real processes, real files, the real CLI."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fixtures_actions import DemoRun, pid_alive, sha256_of
from tests.waiting import wait_until

HOLD = (
    "import signal, sys\n"
    "f = open(sys.argv[1], 'ab')\n"
    "print('holding', flush=True)\n"
    "signal.pause()\n"
)


def cli(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "-c", str(config), *args],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def holder(spawn: Callable[..., Any], path: Path, out: Path, mode: str = "ab") -> Any:
    code = HOLD.replace("'ab'", repr(mode))
    proc = spawn([sys.executable, "-c", code, str(path)], stdout=out.open("wb"))
    wait_until(lambda: out.read_bytes().startswith(b"holding"), 30, what="the holder open")
    return proc


def test_a_writer_of_no_configured_script_is_named_by_the_refusal_and_stopped_by_its_command(
    tmp_path: Path, state_home: Path, spawn: Callable[..., Any], kill_runs_in: list[Path]
) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")
    kill_runs_in.append(demo.workdir)
    data = demo.data_file("B1")
    data.parent.mkdir(parents=True)
    data.write_bytes(b"")
    before = sha256_of(data)
    held = holder(spawn, data, tmp_path / "holder.out")
    bystander = spawn([sys.executable, "-c", "import signal; signal.pause()"])

    refused = cli(demo.config_path, "launch", "demo", "--yes")
    assert refused.returncode != 0, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert f"pid {held.pid}" in said and "one writer per data file" in said
    (fix,) = [c for c in re.findall(r"`([^`]*)`", said) if f"kill demo --pid {held.pid}" in c]
    argv = shlex.split(fix)
    assert argv[0] == "runwatch"

    # A process that holds none of the run's files is not the run's, whatever the user says.
    wrong = cli(demo.config_path, "kill", "demo", "--pid", str(bystander.pid), "--yes")
    assert wrong.returncode != 0 and pid_alive(bystander.pid)
    assert f"pid {bystander.pid}" in wrong.stderr
    # One that has it open to read (a `tail -f`) is listed by its descriptor, but the host, which
    # looks again at the kill, refuses it: it does not write the run's data.
    reader = holder(spawn, data, tmp_path / "reader.out", mode="rb")
    read_only = cli(demo.config_path, "kill", "demo", "--pid", str(reader.pid), "--yes", "--json")
    assert read_only.returncode != 0 and pid_alive(reader.pid)
    (refusal,) = json.loads(read_only.stdout)["results"]
    assert refusal["outcome"] == "refused" and "open for writing" in refusal["detail"]

    # The refusal's command, as given: the holder is shown with why, stopped, exit confirmed.
    killed = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *argv[1:], "--yes", "--json"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert killed.returncode == 0, killed.stdout + killed.stderr
    (result,) = json.loads(killed.stdout)["results"]
    assert result["pid"] == held.pid and result["confirmed"] is True
    assert held.wait(10) is not None
    assert "holds" in killed.stderr and str(data) in killed.stderr
    assert sha256_of(data) == before and pid_alive(bystander.pid)

    launched = cli(demo.config_path, "launch", "demo", "--yes", "--json")
    assert launched.returncode == 0, launched.stdout + launched.stderr
