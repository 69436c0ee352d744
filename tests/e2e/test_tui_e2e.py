"""``runwatch demo`` in a real terminal (tmux): the dashboard shows every dataset and its tokens."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

TOKENS = re.compile(r"\b\d[\d,.]*(?: [kM])? / \d[\d,.]* [kM]\b")
"""A tokens / budget cell such as ``47.5k/50k``."""


def _tmux(socket: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-L", socket, *args], capture_output=True, text=True, timeout=10, check=False
    )


def _screen(socket: str) -> str:
    return _tmux(socket, "capture-pane", "-p", "-t", "demo").stdout


def _poll(condition: Callable[[str], object], timeout: float, what: str, socket: str) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = _screen(socket)
        if condition(screen):
            return screen
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; screen:\n{screen}")
        time.sleep(0.2)  # polling interval of a condition wait


def _leftovers(demo_dir: Path) -> list[psutil.Process]:
    """Processes still running from this demo (an argv element or cwd inside its directory)."""
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "cwd"]):
        try:
            argv = p.info["cmdline"] or []
            cwd = p.info["cwd"] or ""
        except (psutil.Error, OSError):
            continue
        if (p.info["name"] or "").startswith("tmux"):
            continue  # the terminal itself, whose argv names the demo directory
        if cwd.startswith(str(demo_dir)) or any(a.startswith(str(demo_dir)) for a in argv):
            out.append(p)
    return out


@pytest.mark.skipif(shutil.which("tmux") is None and not os.environ.get("CI"), reason="no tmux")
def test_runwatch_demo_in_a_real_terminal(tmp_path: Path, demo_cache_env: dict[str, str]) -> None:
    socket = f"runwatch-e2e-{os.getpid()}"
    demo_dir = tmp_path / "demo"
    env = {**demo_cache_env, "XDG_STATE_HOME": str(tmp_path / "state"), "TERM": "xterm-256color"}
    argv = [sys.executable, "-m", "tui.cli", "demo", "--dir", str(demo_dir)]
    try:
        # The command is given as separate arguments: tmux runs it directly, no shell.
        started = subprocess.run(
            ["tmux", "-L", socket, "-f", "/dev/null", "new-session", "-d", "-s", "demo",
             "-x", "120", "-y", "40", "--", *argv],
            env=env, capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        _tmux(socket, "set-option", "-t", "demo", "remain-on-exit", "on")

        names = [f"B{i}" for i in range(1, 9)]
        screen = _poll(
            lambda s: all(re.search(rf"\b{n}\b", s) for n in names) and TOKENS.search(s),
            timeout=60,
            what="the eight datasets and a token count",
            socket=socket,
        )
        assert "local-gpu" in screen and "api" in screen
        assert "laptop" in screen

        # q leaves the dashboard; the demo then stops everything it started.
        _tmux(socket, "send-keys", "-t", "demo", "q")
        _poll(lambda s: "stopped" in s and "processes" in s, 30, "the demo's clean-up", socket)
        deadline = time.monotonic() + 15
        while _leftovers(demo_dir) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling interval of a condition wait
        assert not _leftovers(demo_dir)
    finally:
        _tmux(socket, "kill-server")
        for p in _leftovers(demo_dir):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                p.kill()
