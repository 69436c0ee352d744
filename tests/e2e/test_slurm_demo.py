"""``runwatch demo --slurm``: the demo's clients as Slurm jobs of this machine's cluster."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from supervisor.config import load_config
from supervisor.demo import launcher
from tests.fixtures_actions import run_pids
from tests.fixtures_slurm import SlurmCluster

RUNWATCH = [sys.executable, "-m", "supervisor.cli"]


def test_demo_runs_its_clients_as_slurm_jobs_and_cancels_them(
    tmp_path: Path, demo_cache_env: dict[str, str], slurm_cluster: SlurmCluster
) -> None:
    demo_dir = tmp_path / "demo"
    r = subprocess.run(
        [*RUNWATCH, "demo", "--headless", "--slurm", "--seconds", "6", "--dir", str(demo_dir)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**demo_cache_env, "SLURM_CONF": str(slurm_cluster.conf)},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    jobs = dict(re.findall(r"submitted run (\S+): Slurm job (\d+) \(runwatch:\S+\)", out))
    assert sorted(jobs) == ["api", "local-gpu", "regen"]
    for run, job in jobs.items():
        assert re.search(rf"run {run} +Slurm job {job} +RUNNING {slurm_cluster.node}", out), run
        assert slurm_cluster.job_state(job) in ("CANCELLED", "FAILED")
    assert "cancelled 3 Slurm jobs" in out and "stopped 2 processes" in out  # the mocks
    cfg = load_config(demo_dir / "runwatch.toml", env={})
    assert [h.kind for h in cfg.hosts] == ["slurm"]
    assert run_pids(demo_dir) == []
    api_log = (demo_dir / "logs/api.log").read_text()
    assert "B5:" in api_log and "HTTP 401" not in api_log  # the key reached the job
    b5 = (demo_dir / "out/B5/raw_responses.jsonl").read_text().splitlines()
    assert b5 and "output_ids" in json.loads(b5[0])
    script = (demo_dir / "out/.runwatch/api.sbatch").read_text()
    assert "exec " in script and "RUNWATCH_DEMO_API_KEY=" not in script


def test_demo_slurm_without_a_cluster_is_refused_before_anything_starts(
    tmp_path: Path, demo_cache_env: dict[str, str]
) -> None:
    r = subprocess.run(
        [*RUNWATCH, "demo", "--headless", "--slurm", "--seconds", "1", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**demo_cache_env, "PATH": "/nonexistent", "SLURM_CONF": "/nonexistent"},
    )
    assert r.returncode != 0
    assert "runwatch demo --slurm" in r.stderr and "not found" in r.stderr
    assert not (tmp_path / "runwatch.toml").exists()
    assert launcher.API_KEY_ENV not in r.stderr
