"""Slurm as a backend of the same rules, on the real single-node cluster: a job's identity
survives ``scontrol requeue`` (its id and the nonce of its comment) and the watcher says so once;
a kill of a throttled array lets no further task start and reports each task; a launch is
refused while a login-node process holds the run's data file or another job of the user runs in
the run's workdir."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.events import Event, EventTracker
from tests.e2e.test_safety_writers import Holders, holders  # noqa: F401 - the fixture
from tests.e2e.test_slurm_e2e import SLURM_RUN, _producing, _run, refresh_until
from tests.e2e.test_slurm_ownership import LOGIN, submit_by_hand
from tests.fixtures_actions import DemoRun, engine_for, launch, why
from tests.fixtures_slurm import SlurmCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.ssh


def _demo(tmp_path: Path, url: str, run_toml: str = SLURM_RUN) -> DemoRun:
    return DemoRun(
        tmp_path, url, max_samples=300, host_name="login", host_toml=LOGIN, run_toml=run_toml
    )


async def test_a_requeued_job_stays_the_runs_and_the_watcher_says_it_once(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    kill_runs_in: list[Path],
) -> None:
    demo = _demo(tmp_path, slow_endpoint.url)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        launched = await launch(engine, "demo")
        assert launched.ok, why(launched)
        job_id = str((launched.identity or {})["job_id"])
        tracker = EventTracker(engine.config)
        first = await refresh_until(engine, _producing("B1"), 60.0, "the job writing B1")
        assert first.job is not None and first.job.job_id == job_id
        events: list[Event] = list(tracker.update(await engine.refresh()))

        slurm_env.run("scontrol", "requeue", job_id)
        again = await refresh_until(
            engine,
            lambda r: r.job is not None and r.job.submit_time != first.job.submit_time,  # type: ignore[union-attr]
            60.0,
            "the run's job listed with its new submit time",
        )
        assert again.job is not None and again.job.job_id == job_id and again.configured
        assert again.state in ("pending", "running"), again
        for _ in range(3):
            events += tracker.update(await engine.refresh())
        requeued = [e for e in events if e.kind == "job-requeued"]
        assert len(requeued) == 1, [e.text() for e in events]
        assert f"job {job_id} was requeued" in requeued[0].message
        assert "still the run's job" in requeued[0].message

        # still the run's: the kill cancels it (the submit time changed, the nonce did not)
        out = await engine.cancel_job("demo")
        assert out["confirmed"] and out["outcome"] in ("cancelled", "terminated", "killed"), out
        assert slurm_env.job_state(job_id) in ("CANCELLED", "")


async def test_a_kill_of_a_throttled_array_starts_no_task_and_reports_each(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    kill_runs_in: list[Path],
) -> None:
    demo = _demo(tmp_path, slow_endpoint.url, SLURM_RUN + "array = true\narray_max_running = 1\n")
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        launched = await launch(engine, "demo")
        assert launched.ok, why(launched)
        job_id = str((launched.identity or {})["job_id"])
        rv = await refresh_until(engine, _producing("B1"), 60.0, "task 0 writing B1")
        assert rv.job is not None
        assert [t.state for t in rv.job.tasks] == ["RUNNING", "PENDING"], rv.job.tasks
        began = time.time()
        out = await engine.cancel_job("demo")
        assert out["confirmed"], out
        assert out["signals"][0] == "cancel-pending", out
        tasks = {t["job_id"]: t for t in out["tasks"]}
        assert sorted(tasks) == [f"{job_id}_0", f"{job_id}_1"], out
        assert tasks[f"{job_id}_0"]["state"] in ("CANCELLED", "FAILED", "COMPLETED"), out
        assert tasks[f"{job_id}_1"]["state"] == "CANCELLED", out
        # no task started once the kill began: the pending one never ran, wrote nothing
        late = [t for t in tasks.values() if t["start_time"] and t["start_time"] >= int(began)]
        assert late == [], out
        assert demo.lines("B2") == []
        assert f"{job_id}_1 CANCELLED (never started)" in out["detail"], out
        assert slurm_env.job_state(job_id) == "" or not any(
            s in ("RUNNING", "PENDING") for s in slurm_env.job_state(job_id).split()
        )


async def test_a_login_node_writer_blocks_a_slurm_launch_naming_its_pid(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    holders: Holders,  # noqa: F811 - the fixture imported above
) -> None:
    demo = _demo(tmp_path, slow_endpoint.url)
    data = demo.data_file("B1")
    data.parent.mkdir(parents=True)
    pid = holders.start("a", data)  # holds raw_responses.jsonl open for append, writes nothing
    async with engine_for(demo) as engine:
        refused = await launch(engine, "demo")
        assert not refused.ok
        failed = refused.failed_step
        assert failed is not None and failed.name == "writers", why(refused)
        assert f"pid {pid}" in failed.detail and "for writing" in failed.detail
        assert f"`kill {pid}` on the login node" in failed.detail, failed
        assert slurm_env.jobs() == []  # nothing submitted
        assert _run(await engine.refresh()).job is None


async def test_another_job_of_the_user_in_the_workdir_blocks_a_slurm_launch(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    slurm_job_script: Path,
) -> None:
    demo = _demo(tmp_path, slow_endpoint.url)
    script = demo.workdir / "by-hand.sh"
    script.write_bytes(slurm_job_script.read_bytes())
    script.chmod(0o755)
    foreign = submit_by_hand(slurm_env, script)  # no comment: not tagged for any run
    async with engine_for(demo) as engine:
        refused = await launch(engine, "demo")
        assert not refused.ok
        failed = refused.failed_step
        assert failed is not None and failed.name == "writers", why(refused)
        assert f"job {foreign} RUNNING" in failed.detail and str(demo.workdir) in failed.detail
        assert f"`scancel {foreign}` on login" in failed.detail, failed
        assert slurm_env.jobs() == [foreign]  # nothing submitted
    wait_until(lambda: slurm_env.job_state(foreign) == "RUNNING", timeout=5.0, what="untouched")
