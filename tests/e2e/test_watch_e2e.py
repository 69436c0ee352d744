"""The whole story: ``runwatch watch`` on the running demo, a webhook receiver listening. The
over-budget run, a killed run and a stopped sshd each give exactly one alert naming the command
to act, and ``on_exit = "restart"`` brings the killed run back through the launch gate."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.demo import launcher
from tests.fixtures_actions import host_toml, pid_alive
from tests.fixtures_alerts import Receiver
from tests.fixtures_sshd import SshdPool
from tests.waiting import wait_until

pytestmark = pytest.mark.ssh

RUNWATCH = [sys.executable, "-m", "supervisor.cli"]


def api_pids(demo_dir: Path) -> list[int]:
    """Live clients of the demo's ``api`` run."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        cmd = p.info["cmdline"] or []
        if (
            str(launcher.CLIENT) in cmd
            and "demo-api" in cmd
            and p.info["cwd"] == str(demo_dir)
            and p.info["status"] != psutil.STATUS_ZOMBIE
        ):
            out.append(p.pid)
    return out


def occurrences(receiver: Receiver, text: str) -> int:
    return sum(m.count(text) for m in receiver.messages())


def test_watch_on_the_demo_alerts_once_per_event_and_restarts_the_killed_run(
    tmp_path: Path,
    demo_cache_env: dict[str, str],
    spawn: Any,
    sshd_pool: SshdPool,
    receiver: Receiver,
) -> None:
    state = tmp_path / "state"
    env = {**demo_cache_env, "XDG_STATE_HOME": str(state)}
    demo_dir = tmp_path / "demo"
    demo_out = tmp_path / "demo.out"
    with open(demo_out, "wb") as f:
        demo = spawn(
            [*RUNWATCH, "demo", "--headless", "--dir", str(demo_dir)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
        )
    wait_until(lambda: "runwatch demo in" in demo_out.read_text(), 90, what="the demo running")
    (first_api,) = wait_until(lambda: api_pids(demo_dir), 30, what="the api run")

    # The demo's config, plus: the api run restarts on failure, a second host over SSH, alerts.
    server = sshd_pool.start("e2e-remote")
    text = (demo_dir / "runwatch.toml").read_text()
    text, n = re.subn(
        r'(\[\[runs\]\]\nname = "api"\n)',
        r'\1on_exit = "restart"\nrestart_backoff_seconds = 0.5\nsettle_seconds = 1.0\n',
        text,
    )
    assert n == 1
    text += "\n" + host_toml(server.host_config("remote", command_timeout=8.0))
    text += f'\n[alerts]\nurls = ["{receiver.url()}"]\n'
    config = tmp_path / "watch.toml"
    config.write_text(text)
    key = (demo_dir / launcher.API_KEY_FILE).read_text().strip()
    out = tmp_path / "watch.out"
    try:
        with open(out, "wb") as f:
            watcher = spawn(
                [*RUNWATCH, "-c", str(config), "watch", "--json", "--interval", "0.5"],
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**env, launcher.API_KEY_ENV: key},
            )
        act = f"runwatch -c {config}"

        # 1. The local run passes B2's budget (it has no --token-budget): one alert.
        over = f"{act} restart local-gpu --set token-budget=50000"
        wait_until(lambda: occurrences(receiver, over), 120, what="the over-budget alert")

        # 2. The api run is killed (not through runwatch): one alert, then restarted.
        os.kill(first_api, signal.SIGKILL)
        wait_until(lambda: occurrences(receiver, f"{act} launch api"), 60, what="run-died")
        wait_until(lambda: occurrences(receiver, "Restarted automatically"), 90, what="the restart")
        (second_api,) = wait_until(lambda: api_pids(demo_dir), 30, what="the new api run")
        assert second_api != first_api and pid_alive(second_api)

        # 3. The SSH host goes away: one alert; it comes back.
        server.stop()
        wait_until(lambda: occurrences(receiver, "Host lost"), 60, what="host lost")
        server.restart()
        wait_until(lambda: occurrences(receiver, "Host is back"), 90, what="host back")

        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(60) == 0
    finally:
        server.stop()
        # The demo stops what it started and the run relaunched for it.
        demo.send_signal(signal.SIGTERM)
        demo.wait(60)
    assert not api_pids(demo_dir)
    assert occurrences(receiver, over) == 1
    assert occurrences(receiver, "Run stopped") == 1
    assert occurrences(receiver, f"{act} launch api") == 1
    assert occurrences(receiver, "Host lost") == 1
    assert occurrences(receiver, f"{act} ps remote") == 1
    events = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [e.get("kind") for e in events]
    assert kinds.count("over-budget") == 1 and kinds.count("run-died") == 1
    assert kinds.count("restart-done") == 1 and kinds.count("host-lost") == 1
    # The restart went through the gate and is audited, with the reason.
    audit = (state / "runwatch" / "audit.jsonl").read_text()
    records = [json.loads(line) for line in audit.splitlines()]
    (launch,) = [r for r in records if r["action"] == "launch" and r["run"] == "api"]
    assert launch["ok"] and [s["name"] for s in launch["steps"]] == [
        "preflight",
        "format-check",
        "fingerprint",
        "writers",
        "quiet",
        "data-repair",
        "launch",
    ]
    assert any(r["action"] == "auto-restart" and r["ok"] for r in records)
    assert key not in out.read_text()  # the API key never shows
