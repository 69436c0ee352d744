"""``runwatch status --watch`` applies each run's budget policy: with ``stop``, a real run past
its dataset's budget (and without ``--token-budget``) is stopped exactly once, audited, and the
redraw says so. The real CLI, agent, process and files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from supervisor.cli.status import CLEAR
from tests.fixtures_actions import over_budget_stop_run
from tests.fixtures_procs import FakeRuns, gone, interrupted
from tests.waiting import wait_until


def test_watch_stops_an_over_budget_run_exactly_once(tmp_path: Path, fake_runs: FakeRuns) -> None:
    run, cfg = over_budget_stop_run(tmp_path, fake_runs, seed=3)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "status", "-c", str(cfg), "--watch", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "PYTHONFAULTHANDLER": "1",
            "XDG_STATE_HOME": str(state),
        },
    )
    assert proc.stdout is not None
    out: list[bytes] = []
    reader = threading.Thread(
        target=lambda: out.extend(iter(lambda: os.read(proc.stdout.fileno(), 65536), b"")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()

    def frames() -> list[str]:
        return b"".join(out).decode(errors="replace").split(CLEAR)

    try:
        wait_until(lambda: gone(run.pid, run.start_time), timeout=60)
        stopped_at = len(frames())
        # Three more refreshes after the stop: the guard does not act again.
        wait_until(lambda: len(frames()) >= stopped_at + 3, timeout=60)
    finally:
        _, err = interrupted(proc)
        reader.join(timeout=10)
    assert proc.returncode == 0, err.decode()
    frame = frames()[-2]
    assert "budget stop: stopped pid " + str(run.pid) in frame, frame
    assert frame.count("budget stop") == 1
    records = [json.loads(line) for line in (state / "runwatch" / "audit.jsonl").open()]
    assert [r["action"] for r in records] == ["kill", "budget"], records
    assert records[1]["policy"] == "stop" and records[1]["ok"] is True
    assert records[0]["identity"]["pid"] == run.pid
