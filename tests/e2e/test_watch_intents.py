"""Durable restart intents (W10, W11): a watcher SIGKILLed during a restart's backoff leaves the
restart written down in the state dir, and the next watcher of the config takes it over (the run
is restarted) or says why it abandons it (a critical event). Real watchers, real demo runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor import audit, intents
from supervisor.config import load_config
from tests.e2e.test_watch_cli import start, text
from tests.fixtures_actions import DemoRun, run_pids
from tests.waiting import wait_until

BACKOFF = """on_exit = "restart"
restart_backoff_seconds = 8
restart_max = 2
restart_window_seconds = 600
settle_seconds = 0.5"""


def launch(demo: DemoRun) -> int:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "supervisor.cli", "-c", str(demo.config_path)),
            *("launch", "demo", "--yes", "--json"),
        ],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return int(json.loads(out.stdout)["identity"]["pid"])


def intent_file(demo: DemoRun) -> Path:
    return intents.path_of(load_config(demo.config_path), "demo")


def test_w10_a_watcher_killed_during_a_backoff_leaves_the_restart_to_the_next_one(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    spawn: Callable[..., Any],
) -> None:
    demo = DemoRun(tmp_path, slow_endpoint.url, max_samples=300, run_toml=BACKOFF)
    kill_runs_in.append(demo.workdir)
    pid = launch(demo)
    first_out = tmp_path / "first.out"
    first = start(spawn, demo.config_path, first_out)
    wait_until(lambda: "first refresh: running demo" in text(first_out), 60, what="a refresh")
    assert run_pids(demo.workdir) == [pid] and not intent_file(demo).exists()
    os.kill(pid, signal.SIGKILL)
    wait_until(intent_file(demo).exists, 60, what="the restart intent before the backoff")
    # The intent is written inside the tick, its event printed when the tick ends.
    wait_until(lambda: "Run stopped" in text(first_out), 30, what="the death's event")
    intent = json.loads(intent_file(demo).read_text())
    assert intent["run"] == "demo" and intent["attempt"] == 1
    assert intent["reason"].startswith("run-died: ") and intent["not_before"] > intent["written"]
    assert intent_file(demo).stat().st_mode & 0o777 == 0o600
    first.send_signal(signal.SIGKILL)  # during the backoff: the restart is not made
    first.wait(30)
    assert run_pids(demo.workdir) == []

    second_out = tmp_path / "second.out"
    second = start(spawn, demo.config_path, second_out)
    wait_until(
        lambda: "took over the pending restart of demo (attempt 1" in text(second_out),
        60,
        what="the takeover",
    )
    wait_until(lambda: run_pids(demo.workdir), 90, what="the run restarted by the new watcher")
    wait_until(lambda: "Restarted automatically" in text(second_out), 30, what="its event")
    wait_until(lambda: not intent_file(demo).exists(), 30, what="the intent removed")
    (new,) = run_pids(demo.workdir)
    assert new != pid
    auto = [r for r in audit.read() if r["action"] == "auto-restart"]
    assert len(auto) == 1 and auto[0]["ok"] is True
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0
    assert "Traceback" not in text(first_out) + text(second_out)


def test_w11_an_intent_the_next_watcher_cannot_keep_is_abandoned_with_the_reason(
    tmp_path: Path, state_home: Path, spawn: Callable[..., Any]
) -> None:
    # A config whose run no longer restarts on failure, and an intent left for it.
    demo = DemoRun(tmp_path, "http://127.0.0.1:9/v1")
    config = load_config(demo.config_path)
    intents.write(
        config,
        intents.Intent(
            run="demo", host="local", attempt=1, not_before=0.0, reason="run-died: test",
            written=0.0, by="someone",
        ),
    )  # fmt: skip
    out = tmp_path / "watch.out"
    proc = start(spawn, demo.config_path, out)
    wait_until(lambda: "pending restart abandoned" in text(out), 60, what="the abandon event")
    line = next(li for li in text(out).splitlines() if "pending restart abandoned" in li)
    assert "CRITICAL demo" in line
    assert 'on_exit is now "alert", not "restart"' in line and "run-died: test" in line
    assert not intent_file(demo).exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
