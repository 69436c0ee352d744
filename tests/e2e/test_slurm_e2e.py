"""A run as a Slurm job, end to end, on the real single-node cluster: over the sshd fixture to a
login node that is this machine (and locally, as an array of one task per dataset)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.engine import Engine
from supervisor.model import RunView, Snapshot
from tests.fixtures_actions import (
    DemoRun,
    engine_for,
    host_toml,
    launch,
    legacy_record,
    restart,
    run_pids,
    why,
)
from tests.fixtures_slurm import SlurmCluster
from tests.fixtures_sshd import SshdServer
from tests.waiting import wait_until

pytestmark = pytest.mark.ssh

SLURM_RUN = 'stop_grace_seconds = 5.0\n[runs.slurm]\npartition = "rw"\ntime = "0:30:00"\n'


def _run(snap: Snapshot, name: str = "demo") -> RunView:
    return next(r for h in snap.hosts for r in h.runs if r.name == name)


async def refresh_until(
    engine: Engine, cond: Callable[[RunView], bool], timeout: float, what: str
) -> RunView:
    """Refresh until the demo run's view satisfies ``cond`` (polling, bounded by ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        rv = _run(await engine.refresh())
        if cond(rv):
            return rv
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}: {rv}")
        await asyncio.sleep(0.3)  # polling interval of a bounded condition wait


def _producing(*names: str) -> Callable[[RunView], bool]:
    """The run is running and each dataset of ``names`` shows tokens and a rate."""

    def check(rv: RunView) -> bool:
        shown = [d for d in rv.datasets if d.name in names]
        return (
            rv.state == "running"
            and len(shown) == len(names)
            and all(d.completion_tokens > 0 and d.rates.tok_per_s_1m for d in shown)
        )

    return check


async def test_slurm_run_over_ssh_shows_tokens_is_gated_and_cancelled(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    slurm_sshd: SshdServer,
    kill_runs_in: list[Path],
) -> None:
    login = slurm_sshd.host_config("login", kind="slurm")
    demo = DemoRun(
        tmp_path, slow_endpoint.url, host_toml=host_toml(login), host_name="login",
        max_samples=300, run_toml=SLURM_RUN,
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        launched = await launch(engine, "demo")
        assert launched.ok, why(launched)
        job_id = str((launched.identity or {})["job_id"])
        # confirmed running, or reported pending with its reason while the node frees up
        assert re.match(rf"job {job_id} (RUNNING on |PENDING \()", launched.steps[-1].detail)
        wait_until(lambda: slurm_env.job_state(job_id) == "RUNNING", timeout=30.0)

        # status: the scheduler's state and the per-dataset tokens and rate
        # (the client writes its datasets one after the other)
        rv = await refresh_until(engine, _producing("B1"), 60.0, "tokens and a rate for B1")
        assert rv.job is not None and rv.job.job_id == job_id
        assert rv.job.state == "RUNNING" and rv.job.nodes == slurm_env.node
        assert rv.job.time_limit_s == 1800 and rv.job.elapsed_s is not None
        assert rv.job.stdout == str(demo.workdir / "logs" / "run.log")
        assert rv.process is None
        assert [d.name for d in rv.datasets] == ["B1", "B2"]
        wait_until(lambda: "B1" in demo.log_text(), timeout=30.0)

        # a restart refused by the format gate leaves the job running
        with open(demo.data_file("B1"), "ab") as f:  # one O_APPEND write: a whole line
            f.write(legacy_record("B1-legacy"))
        refused = await restart(engine, "demo")
        assert not refused.ok
        failed = refused.failed_step
        assert failed is not None and failed.name == "format-check", why(refused)
        assert "not in format" in failed.detail
        assert [s.state for s in refused.steps if s.name in ("stop", "launch")] == [
            "pending", "pending"
        ]  # fmt: skip
        assert slurm_env.job_state(job_id) == "RUNNING"
        assert _run(await engine.refresh()).state == "running"

        # kill: scancel with grace, confirmed by the job's terminal state
        out = await engine.cancel_job("demo")
        assert out["outcome"] == "terminated" and out["confirmed"], out
        assert out["signals"] == ["SIGTERM"] and out["writers"] == {}
        assert slurm_env.job_state(job_id) in ("CANCELLED", "FAILED", "COMPLETED")
        assert run_pids(demo.workdir) == []
        rv = await refresh_until(engine, lambda r: r.state == "stopped", 15.0, "stopped")
        assert rv.job is not None and rv.job.state == out["state"]


async def test_slurm_array_one_task_per_dataset_locally(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    kill_runs_in: list[Path],
) -> None:
    demo = DemoRun(
        tmp_path, slow_endpoint.url, max_samples=300, host_name="login",
        host_toml='[[hosts]]\nname = "login"\nlocal = true\nkind = "slurm"\n',
        run_toml=SLURM_RUN + "array = true\n",
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        launched = await launch(engine, "demo")
        assert launched.ok, why(launched)
        job_id = str((launched.identity or {})["job_id"])
        rv = await refresh_until(engine, _producing("B1", "B2"), 60.0, "both tasks' tokens")
        assert rv.job is not None and rv.job.job_id == job_id
        assert [(t.task, t.state) for t in rv.job.tasks] == [(0, "RUNNING"), (1, "RUNNING")]
        assert {t.stdout for t in rv.job.tasks} == {
            str(demo.workdir / "data" / ".runwatch" / f"slurm-{job_id}_{i}.log") for i in (0, 1)
        }
        pids = run_pids(demo.workdir)
        assert len(pids) == 2  # one client per dataset
        datasets = sorted(
            Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[3].decode() for p in pids
        )
        assert datasets == ["B1", "B2"]
        again = await restart(engine, "demo", dry_run=True)
        assert again.ok, why(again)
        out = await engine.cancel_job("demo")
        assert out["confirmed"], out
        assert run_pids(demo.workdir) == []
        assert os.path.exists(demo.data_file("B1")) and os.path.exists(demo.data_file("B2"))


async def test_slurm_restart_cancels_the_job_and_submits_the_new_argv(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    kill_runs_in: list[Path],
) -> None:
    demo = DemoRun(
        tmp_path, slow_endpoint.url, max_samples=300, host_name="login",
        host_toml='[[hosts]]\nname = "login"\nlocal = true\nkind = "slurm"\n', run_toml=SLURM_RUN,
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        launched = await launch(engine, "demo")
        assert launched.ok, why(launched)
        old_job = str((launched.identity or {})["job_id"])
        await refresh_until(engine, _producing("B1"), 60.0, "tokens for B1")
        before = demo.data_file("B1").read_bytes()
        restarted = await restart(engine, "demo", overrides=["token-budget=5000"])
        assert restarted.ok, why(restarted)
        steps = {s.name: s for s in restarted.steps}
        assert steps["stop"].detail.startswith(f"job {old_job}: terminated")
        assert steps["gpu-release"].state == "skipped"
        new_job = str((restarted.identity or {})["job_id"])
        assert new_job != old_job
        assert slurm_env.job_state(old_job) in ("CANCELLED", "FAILED")
        wait_until(lambda: slurm_env.job_state(new_job) == "RUNNING", timeout=30.0)
        assert demo.data_file("B1").read_bytes().startswith(before)  # nothing lost
        rv = await refresh_until(
            engine, lambda r: r.job is not None and r.job.job_id == new_job, 15.0, "the new job"
        )
        assert rv.state == "running"
        (pid,) = run_pids(demo.workdir)
        assert b"--token-budget\x005000" in Path(f"/proc/{pid}/cmdline").read_bytes()
        out = await engine.cancel_job("demo")
        assert out["confirmed"], out
