"""The command line on a Slurm host (this machine as the login node): launch submits a job, ps and
status show it with the scheduler's state, kill cancels it with proof, audit records both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fixtures_actions import DemoRun, run_pids, runwatch
from tests.fixtures_slurm import SlurmCluster
from tests.waiting import wait_until

LOGIN = '[[hosts]]\nname = "login"\nlocal = true\nkind = "slurm"\n'


def test_launch_ps_status_kill_on_a_slurm_host(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    kill_runs_in: list[Path],
) -> None:
    demo = DemoRun(
        tmp_path, slow_endpoint.url, max_samples=300, host_toml=LOGIN, host_name="login",
        run_toml='[runs.slurm]\ntime = "10"\njob_name = "rw demo; $(id)"\n',
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    cfg = str(demo.config_path)
    dry = runwatch("launch", "demo", "-c", cfg, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["steps"][-1]["detail"] == (
        "dry run: would sbatch the run as a job tagged runwatch:demo"
    )
    assert slurm_env.jobs() == []

    launched = runwatch("launch", "demo", "-c", cfg, "--yes", "--json")
    assert launched.returncode == 0, launched.stderr + launched.stdout
    job_id = json.loads(launched.stdout)["identity"]["job_id"]
    assert slurm_env.jobs() == [job_id]
    again = runwatch("launch", "demo", "-c", cfg, "--yes")
    assert again.returncode != 0 and f"Slurm job {job_id}" in again.stderr

    wait_until(lambda: demo.complete_ids("B1"), timeout=30.0)
    ps = runwatch("ps", "-c", cfg)
    assert ps.returncode == 0, ps.stderr
    assert "login: 1 Slurm job" in ps.stdout
    assert f"job {job_id}" in ps.stdout and "demo  RUNNING on " + slurm_env.node in ps.stdout
    assert "limit 10 min" in ps.stdout
    status = runwatch("status", "-c", cfg)
    assert status.returncode == 0, status.stderr
    assert f"demo  running  job {job_id} RUNNING on {slurm_env.node}" in status.stdout
    assert "of 10 min" in status.stdout
    as_json = json.loads(runwatch("status", "-c", cfg, "--json").stdout)
    run = as_json["hosts"][0]["runs"][0]
    assert run["job"]["job_id"] == job_id and run["job"]["name"] == "rw demo; $(id)"

    killed = runwatch("kill", "demo", "-c", cfg, "--yes", "--json", "--grace", "5")
    assert killed.returncode == 0, killed.stderr + killed.stdout
    (out,) = json.loads(killed.stdout)["results"]
    assert out["outcome"] == "terminated" and out["confirmed"] is True
    assert run_pids(demo.workdir) == []
    assert slurm_env.jobs() == []
    none_left = runwatch("kill", "demo", "-c", cfg, "--yes")
    assert none_left.returncode != 0 and "no queued or running Slurm job" in none_left.stderr

    audit = [json.loads(line) for line in (state_home / "audit.jsonl").read_text().splitlines()]
    assert [(a["action"], a["ok"]) for a in audit] == [("launch", True), ("kill", True)]
    assert audit[1]["identity"]["job_id"] == job_id
