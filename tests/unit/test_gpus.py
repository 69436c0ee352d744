"""GPUs: nvidia-smi's documented CSV (``[N/A]`` fields included) read by the agent, shown per GPU
with the runs whose processes hold it, through the real engine and agent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor.agent import gpu
from supervisor.config import Config, load_config
from supervisor.engine import Engine
from supervisor.live import Live
from supervisor.model import Identity, ProcessInfo, RunView
from tests.fixtures_config import write_local_config

# What `nvidia-smi --query-gpu=index,uuid,name,utilization.gpu,memory.used,memory.total,
# power.draw,temperature.gpu --format=csv,noheader,nounits` and `--query-compute-apps=pid,
# gpu_uuid,used_memory` print; GPU 1 cannot report its power.
STAND_IN = """#!/bin/sh
case "$1" in
  --query-compute-apps=*)
    echo "4242, GPU-aaaa, 70000"
    echo "4243, GPU-bbbb, [N/A]"
    ;;
  --query-gpu=*)
    echo "0, GPU-aaaa, NVIDIA H100 80GB HBM3, 97, 71234, 81559, 612.35, 71"
    echo "1, GPU-bbbb, NVIDIA H100 80GB HBM3, 0, 3, 81559, [N/A], 34"
    ;;
esac
"""


@pytest.fixture
def stand_in_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(STAND_IN)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return smi


def test_the_documented_csv_with_na_fields(stand_in_smi: Path) -> None:
    per_pid, summary = gpu.query_gpu()
    assert per_pid == {4242: 70000.0, 4243: 0.0}
    assert summary is not None
    first, second = summary["gpus"]
    assert first == {
        "index": 0,
        "uuid": "GPU-aaaa",
        "name": "NVIDIA H100 80GB HBM3",
        "utilization_pct": 97.0,
        "memory_used_mb": 71234.0,
        "memory_total_mb": 81559.0,
        "power_w": 612.35,
        "temperature_c": 71.0,
        "pids": [4242],
    }
    assert second["power_w"] is None and second["pids"] == [4243]


def test_each_gpu_names_the_runs_holding_it() -> None:
    live = Live(Config(), persist=False)
    proc = ProcessInfo(
        identity=Identity(boot_id="b", pid=10, start_time=1, uid=0, argv=("x",)),
        user="u",
        uptime_s=1.0,
        cpu_percent=0.0,
        rss_mb=1.0,
        state="S",
        children=[11, 12],
    )
    run = RunView(name="eagle3", host="gpu1", state="running", process=proc)
    summary = {
        "gpus": [
            {"index": 0, "uuid": "GPU-a", "utilization_pct": 90.0, "pids": [12]},
            {"index": 1, "uuid": "GPU-b", "utilization_pct": None, "pids": [99]},
        ]
    }
    (a, b), error = live.gpus("gpu1", summary, [run], now=100.0)
    assert error is None
    # A worker child of the run holds GPU 0; GPU 1's holder is no run of ours.
    assert (a.runs, b.runs) == (["eagle3"], [])
    assert a.history == [90.0] and b.history == []
    assert live.gpus("gpu1", {"error": "nvidia-smi failed"}, [], 1.0) == ([], "nvidia-smi failed")


async def test_engine_shows_every_gpu_each_refresh(stand_in_smi: Path, tmp_path: Path) -> None:
    cfg = write_local_config(tmp_path / "c.toml", "", python=True)
    async with Engine(load_config(cfg)) as engine:
        await engine.refresh()
        snap = await engine.refresh()
    (host,) = snap.hosts
    assert host.has_gpu and host.gpu_error is None
    assert [(g.index, g.utilization_pct, g.power_w) for g in host.gpus] == [
        (0, 97.0, 612.35),
        (1, 0.0, None),
    ]
    assert host.gpus[0].memory_used_mb == 71234.0 and host.gpus[0].temperature_c == 71.0
