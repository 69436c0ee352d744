"""The watcher's own state cannot be written (W22): the state dir's `intents` and `alerts` are
not directories any more (as a read-only or full state dir, or one a user's cleanup replaced,
refuses every write; root ignores file modes, so a file in the way stands for it). A death is
still shown, alerted and restarted; the user is told, once, what will not survive the watcher.
Real watcher processes, real demo runs, a real webhook receiver."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor import audit
from supervisor.paths import state_dir
from tests.e2e.test_watch_cli import start, text
from tests.e2e.test_watch_intents import launch
from tests.fixtures_actions import DemoRun, run_pids
from tests.fixtures_alerts import Receiver
from tests.unit.test_watch_state import append_by_another_writer
from tests.waiting import wait_until

RESTART = """on_exit = "restart"
restart_backoff_seconds = 2
restart_max = 2
restart_window_seconds = 600
settle_seconds = 0.5"""


def block(path: Path) -> None:
    """``path`` made a regular file: nothing can be made or written under it."""
    if path.is_dir():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a directory\n")


def test_w22_a_state_dir_that_refuses_writes_loses_no_death_and_says_so(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    receiver = Receiver()
    try:
        demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=RESTART)
        demo.config_path.write_text(
            demo.config_path.read_text() + f'\n[alerts]\nurls = ["{receiver.url()}"]\n'
        )
        kill_runs_in.append(demo.workdir)
        pid = launch(demo)
        out = tmp_path / "watch.out"
        watcher = start(spawn, demo.config_path, out)
        wait_until(lambda: "first refresh: running demo" in text(out), 60, what="a refresh")
        block(state_dir() / "intents")
        block(state_dir() / "alerts")
        os.kill(pid, signal.SIGKILL)
        # The death is shown and alerted although its intent and its spool file cannot be kept.
        wait_until(lambda: "Run stopped" in text(out), 60, what="the run-died event")
        wait_until(
            lambda: any("demo" in str(b) for b in receiver.bodies), 30, what="the alert delivered"
        )
        # The restart is still made (from memory), and said.
        wait_until(lambda: "Restarted automatically" in text(out), 90, what="the restart")
        (new,) = run_pids(demo.workdir)
        assert new != pid
        said = text(out)
        assert "restart intent of demo not written" in said
        assert "will not survive this watcher" in said
        assert "alert spool" in said and "not written" in said
        assert "not removed" not in said  # never written: nothing to remove
        # Told once, not at every write.
        assert said.count("restart intent of demo not written") == 1
        assert "refresh failed" not in said and "Traceback" not in said
        # A second watcher on the same state dir starts and watches (it cannot read the intents
        # a killed watcher may have left, and says so).
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(60) == 0
        out2 = tmp_path / "second.out"
        second = start(spawn, demo.config_path, out2)
        wait_until(lambda: "first refresh: running demo" in text(out2), 60, what="a refresh")
        assert "pending restarts not read" in text(out2)
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0
        assert "Traceback" not in text(out2)
    finally:
        receiver.close()


def test_w22_an_audit_log_refused_as_unsafe_is_said_and_the_refreshes_go_on(
    tmp_path: Path, state_home: Path, spawn: Callable[..., Any]
) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")  # never launched
    audit.record("kill", host="local", run="demo", ok=True)
    out = tmp_path / "watch.out"
    watcher = start(spawn, demo.config_path, out)
    wait_until(lambda: "first refresh" in text(out), 60, what="a refresh")
    os.chmod(audit.audit_path(), 0o666)  # writable by others: refused, never trusted
    append_by_another_writer()
    wait_until(lambda: "the audit log cannot be read" in text(out), 60, what="the note")
    said = text(out)
    assert said.count("the audit log cannot be read") == 1 and "chmod 600" in said
    ticks = said.count(" refresh ")
    wait_until(lambda: text(out).count(" refresh ") >= ticks + 3, 60, what="refreshes go on")
    assert "refresh failed" not in text(out)
    os.chmod(audit.audit_path(), 0o600)
    wait_until(lambda: "the audit log can be read again" in text(out), 60, what="the all-clear")
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(60) == 0
    assert "Traceback" not in text(out)
