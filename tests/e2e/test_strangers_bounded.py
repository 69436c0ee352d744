"""A long-lived engine on a shared machine (W30): others' runs come and go, each with a new pid
and new files, for as long as a watcher or the dashboard runs. What the engine keeps of them (rate
trackers, history rings, data-loss sizes) is forgotten once they are gone, so it stays bounded by
what runs now; what it keeps of the config's own runs stays."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import live as live_module
from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.model import Snapshot
from tests.fixtures_config import write_local_config

STRANGER = "import time\nwhile True:\n    time.sleep(3600)\n"
GENERATIONS = 6


def _record(i: int) -> str:
    rec = {"sample_id": f"s{i}", "output_ids": [1, 2, 3], "prompt_tokens": 3}
    return json.dumps(rec | {"completion_tokens": 3, "finish_reason": "stop"}) + "\n"


def _listed(snap: Snapshot, dataset: str) -> bool:
    return any(
        not r.configured and any(d.name == dataset for d in r.datasets)
        for h in snap.hosts
        for r in h.runs
    )


async def test_w30_what_is_kept_of_others_runs_that_come_and_go_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Others' files are forgotten as soon as they are not seen (the product waits two minutes).
    monkeypatch.setattr(live_module, "THEIRS_IDLE_S", 0.0)
    work = tmp_path / "work"
    ours = work / "out" / "B1" / "raw_responses.jsonl"
    ours.parent.mkdir(parents=True)
    ours.write_text("".join(_record(i) for i in range(5)))
    cfg = write_local_config(
        tmp_path / "c.toml",
        f"""
[[runs]]
name = "gen"
host = "here"
workdir = "{work}"
argv = ["python3", "run_inference.py", "--datasets", "B1", "--output-dir", "out"]
""",
        python=True,
    )
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "run_inference.py").write_text(STRANGER)
    config = load_config(cfg)
    kept: list[tuple[int, int, int]] = []
    async with Engine(config) as engine:
        for n in range(GENERATIONS):
            data = theirs / f"out{n}" / f"S{n}" / "raw_responses.jsonl"
            data.parent.mkdir(parents=True)
            data.write_text("".join(_record(i) for i in range(3)))
            argv = [sys.executable, "run_inference.py", "--datasets", f"S{n}"]
            proc = subprocess.Popen([*argv, "--output-dir", f"out{n}"], cwd=theirs)
            try:
                snap = await engine.refresh()
                assert _listed(snap, f"S{n}"), f"the stranger S{n} is not listed"
            finally:
                proc.kill()
                proc.wait()
            snap = await engine.refresh()
            assert not _listed(snap, f"S{n}")
            history = engine._live.history.keys()
            assert f"ds|here|{ours}" in history, "the config's own dataset lost its history"
            assert not [k for k in history if str(theirs) in k], history
            # What is kept of this test's files (the machine's other processes come and go).
            mine = str(tmp_path)
            kept.append(
                (
                    sum(mine in str(k) for k in engine._trackers._by_key),
                    sum(mine in k for k in history),
                    sum(mine in k[1] for k in engine._dataloss._seen),
                )
            )
    # The same after the sixth stranger as after the first: nothing of the others piles up.
    assert kept == [kept[0]] * GENERATIONS, kept
