"""``runwatch status --watch``, ``runwatch guard`` and the dashboard apply the budget policy the
same way, through ``Engine.tick`` (the import contract keeps them from reaching
``supervisor.guard`` themselves): each, on a fresh over-budget run under ``budget_policy =
"stop"`` (one shared fixture), kills it once and writes one audited ``budget`` record, and the
three records are the same but for the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from supervisor.cli.status import CLEAR
from supervisor.config import load_config
from supervisor.engine import Engine
from tests.fixtures_actions import over_budget_stop_run
from tests.fixtures_procs import FakeRun, FakeRuns, gone, interrupted
from tests.waiting import wait_for, wait_until
from tui.app import make_app

SEED = 11
TOP = "refresh_seconds = 0.3"


def _env(state: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        "XDG_STATE_HOME": str(state),
    }


def _status_watch(run: FakeRun, cfg: Path, state: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "status", "-c", str(cfg), "--watch", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(state),
    )
    assert proc.stdout is not None
    out: list[bytes] = []
    fd = proc.stdout.fileno()
    reader = threading.Thread(
        target=lambda: out.extend(iter(lambda: os.read(fd, 65536), b"")), daemon=True
    )
    reader.start()

    def frames() -> int:
        return len(b"".join(out).split(CLEAR.encode()))

    try:
        wait_until(lambda: gone(run.pid, run.start_time), timeout=60)
        stopped_at = frames()
        wait_until(lambda: frames() >= stopped_at + 3, timeout=60)  # it does not act again
    finally:
        _, err = interrupted(proc)
        reader.join(timeout=10)
    assert proc.returncode == 0, err.decode()


def _guard(run: FakeRun, cfg: Path, state: Path) -> None:
    def guard() -> list[Any]:
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", "guard", "-c", str(cfg), "--json"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(state),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        result: list[Any] = json.loads(done.stdout)
        return result

    (outcome,) = guard()
    assert outcome["acted"] is True and outcome["ok"] is True
    wait_until(lambda: gone(run.pid, run.start_time), timeout=30)
    assert guard() == []  # acted on once, ever


async def _dashboard(run: FakeRun, cfg: Path, state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    config = load_config(cfg)
    app = make_app(config, Engine(config))
    async with app.run_test(size=(120, 36)):
        await wait_for(lambda: gone(run.pid, run.start_time), timeout=60, what="the stop")
        seen = app.refreshes
        await wait_for(lambda: app.refreshes >= seen + 3, 30, what="three more refreshes")
    assert [a.kind for a in app.alerts if a.kind == "budget-policy"] == ["budget-policy"]


async def test_every_front_end_stops_an_over_budget_run_once_through_the_engine(
    tmp_path: Path, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets: dict[str, dict[str, Any]] = {}
    for front_end in ("status --watch", "guard", "dashboard"):
        root = tmp_path / front_end.split()[0]
        root.mkdir()
        state = root / "state"
        run, cfg = over_budget_stop_run(root, fake_runs, seed=SEED, top=TOP)
        if front_end == "status --watch":
            _status_watch(run, cfg, state)
        elif front_end == "guard":
            _guard(run, cfg, state)
        else:
            await _dashboard(run, cfg, state, monkeypatch)
        assert gone(run.pid, run.start_time), front_end
        records = [json.loads(x) for x in (state / "runwatch" / "audit.jsonl").open()]
        assert [r["action"] for r in records] == ["kill", "budget"], (front_end, records)
        kill, budget = records
        assert kill["identity"]["pid"] == run.pid and kill["ok"] is True, front_end
        assert budget["identity"]["pid"] == run.pid, front_end
        assert budget["policy"] == "stop" and budget["ok"] is True, front_end
        assert f"stopped pid {run.pid}" in budget["detail"], front_end
        # Who acted and from where: the front end, in every record.
        origin = {"status --watch": "runwatch status", "guard": "runwatch guard"}
        assert budget["by"].endswith(origin.get(front_end, "dashboard")), budget["by"]
        assert kill["by"] == budget["by"], front_end
        # Each front end acts on its own config (its own root): the record names it.
        assert budget["config"] == kill["config"] == load_config(cfg).key, front_end
        budgets[front_end] = {
            k: v
            for k, v in budget.items()
            # the process and the config differ, nothing else
            if k not in ("time", "identity", "detail", "by", "config")
        }
    first, *rest = budgets.values()
    assert all(b == first for b in rest), budgets
