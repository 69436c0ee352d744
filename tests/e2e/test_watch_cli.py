"""``runwatch watch`` as a real process: one watcher per config (the second says who holds it and
exits 3, or stands by and takes over), a clean exit on SIGTERM and SIGINT, JSON lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fixtures_actions import DemoRun
from tests.waiting import wait_until


def watch_argv(config: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "supervisor.cli",
        "-c",
        str(config),
        "watch",
        "--interval",
        "0.3",
        *extra,
    ]


def start(spawn: Callable[..., Any], config: Path, out: Path, *extra: str) -> Any:
    """A watcher whose output goes to ``out``."""
    return spawn(watch_argv(config, *extra), stdout=out.open("wb"), stderr=subprocess.STDOUT)


def text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_one_watcher_per_config_and_a_standby_takes_over(
    tmp_path: Path, state_home: Path, spawn: Callable[..., Any]
) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")  # never launched: nothing to do
    first_out, standby_out = tmp_path / "first.out", tmp_path / "standby.out"
    first = start(spawn, demo.config_path, first_out)
    wait_until(lambda: "watching 1 host(s)" in text(first_out), 30, what="the first watcher")

    second = subprocess.run(
        watch_argv(demo.config_path), capture_output=True, text=True, timeout=60
    )
    assert second.returncode == 3, second.stdout + second.stderr
    assert f"another watcher acts on this config already: pid {first.pid}" in second.stderr
    assert "--standby" in second.stderr

    standby = start(spawn, demo.config_path, standby_out, "--standby")
    wait_until(lambda: "standing by" in text(standby_out), 30, what="the standby")
    assert f"pid {first.pid}" in text(standby_out)

    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0
    assert text(first_out).rstrip().endswith("stopped")
    wait_until(lambda: "taking over" in text(standby_out), 30, what="the takeover")
    standby.send_signal(signal.SIGINT)
    assert standby.wait(30) == 0
    assert "Traceback" not in text(first_out) + text(standby_out)


def test_json_lines_name_the_command(
    tmp_path: Path, state_home: Path, spawn: Callable[..., Any]
) -> None:
    # A run whose only dataset is already done: a duplicate id is a problem found at start.
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1", datasets=("B1",))
    data = demo.data_file("B1")
    data.parent.mkdir(parents=True)
    from tests.fixtures_actions import raw_record

    data.write_bytes(raw_record("B1-1") + raw_record("B1-1") + raw_record("B1-2"))
    # An alert URL holding a token, from the environment: never shown.
    token = "tok-0123456789abcdef"
    text_cfg = demo.config_path.read_text()
    demo.config_path.write_text(
        text_cfg + '\n[alerts]\nurls = ["json://bot:${RW_HOOK_TOKEN}@127.0.0.1:9/x"]\n'
    )
    out = tmp_path / "json.out"
    err = tmp_path / "json.err"
    proc = spawn(
        watch_argv(demo.config_path, "--json"),
        stdout=out.open("wb"),
        stderr=err.open("wb"),
        env={**os.environ, "RW_HOOK_TOKEN": token},
    )
    wait_until(lambda: '"duplicates"' in text(out), 30, what="the duplicates event")
    wait_until(lambda: "alert not delivered" in text(out), 30, what="the failed delivery")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    lines = [json.loads(line) for line in text(out).splitlines()]
    (dup,) = [e for e in lines if e.get("kind") == "duplicates"]
    assert dup["severity"] == "warning" and dup["run"] == "demo" and dup["dataset"] == "B1"
    assert dup["command"] == f"runwatch -c {demo.config_path.resolve()} check demo"
    assert "1 duplicate sample ids" in dup["message"]
    assert lines[0]["note"].startswith("watching") and lines[-1]["note"] == "stopped"
    assert "alerts to json://127.0.0.1/***" in lines[0]["note"]
    assert token not in text(out) + text(err)
    assert any(e.get("note", "").startswith("alert not delivered") for e in lines)
