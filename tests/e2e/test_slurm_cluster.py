"""The Slurm test cluster itself: a batch job runs within seconds, locally and from a login node
reached over the real sshd."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fixtures_slurm import SlurmCluster
from tests.fixtures_sshd import SshdServer
from tests.waiting import wait_until


def test_batch_job_runs_within_seconds(slurm_cluster: SlurmCluster, slurm_job_script: Path) -> None:
    out = slurm_job_script.parent / "job.out"
    job = slurm_cluster.run(
        "sbatch", "--parsable", "-J", "fixture-check", "-o", str(out), str(slurm_job_script)
    ).stdout.strip()
    try:
        assert job.isdigit(), job
        wait_until(lambda: slurm_cluster.job_state(job) == "RUNNING", timeout=15.0)
        wait_until(lambda: out.exists() and "hello from job" in out.read_text(), timeout=15.0)
        assert out.read_text().strip() == f"hello from job {job}"
    finally:
        slurm_cluster.run("scancel", job, check=False)
    wait_until(lambda: slurm_cluster.job_state(job) in ("CANCELLED", "FAILED"), timeout=15.0)


def _ssh(server: SshdServer, *command: str) -> subprocess.CompletedProcess[str]:
    argv = [
        "ssh", "-F", "/dev/null", "-i", str(server.client_key), "-p", str(server.port),
        "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes", f"{server.user}@{server.host}", *command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_login_node_over_sshd_sees_the_cluster(
    slurm_sshd: SshdServer, slurm_cluster: SlurmCluster
) -> None:
    done = _ssh(slurm_sshd, "sinfo --noheader -o %n:%T")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{slurm_cluster.node}:idle"
