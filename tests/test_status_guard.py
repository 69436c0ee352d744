"""``runwatch status --watch`` applies each run's budget policy: with ``stop``, a real run past
its dataset's budget (and without ``--token-budget``) is stopped exactly once, audited, and the
redraw says so. The real CLI, agent, process and files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from supervisor.cli.status import CLEAR
from tests.fixtures_data import make_raw
from tests.fixtures_procs import FakeRuns, gone, wait_until

ARGS = ("--datasets", "B1", "--output-dir", "out")


def test_watch_stops_an_over_budget_run_exactly_once(tmp_path: Path, fake_runs: FakeRuns) -> None:
    work = tmp_path / "w"
    (work / "out" / "B1").mkdir(parents=True)
    truth = make_raw(work / "out" / "B1" / "raw_responses.jsonl", 40, seed=3)
    budget = truth.completion_tokens // 2
    run = fake_runs.start(*ARGS, cwd=work)
    cfg = tmp_path / "rw.toml"
    cfg.write_text(
        f"""
scripts = ["run_inference.py"]

[[hosts]]
name = "here"
local = true

[datasets.B1]
token_budget = {budget}

[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = {json.dumps(["python3", "run_inference.py", *ARGS])}
budget_policy = "stop"
stop_grace_seconds = 5.0
"""
    )
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "status", "-c", str(cfg), "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(state)},
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
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        reader.join(timeout=10)
    assert proc.returncode == 0, err.decode()
    frame = frames()[-2]
    assert "budget stop: stopped pid " + str(run.pid) in frame, frame
    assert frame.count("budget stop") == 1
    records = [json.loads(line) for line in (state / "runwatch" / "audit.jsonl").open()]
    assert [r["action"] for r in records] == ["kill", "budget"], records
    assert records[1]["policy"] == "stop" and records[1]["ok"] is True
    assert records[0]["identity"]["pid"] == run.pid
