"""Jobs as runs: which job is a run's, aggregated array state, what is shown."""

from __future__ import annotations

from typing import Any

from supervisor.slurm import OwnedJob, dataset_alive, describe, job_views, run_state


def owned(*ids: str, run: str = "gen", submit_time: int | None = 100) -> dict[str, OwnedJob]:
    """The record of jobs ``ids`` submitted by runwatch for ``run``."""
    return {
        i: OwnedJob(run=run, host="login", job_id=i, submit_time=submit_time, how="submitted",
                    time=0.0)
        for i in ids
    }  # fmt: skip


def job(job_id: str, state: str, comment: str = "runwatch:gen", **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": job_id, "array_job_id": None, "array_task_id": None, "state": state,
        "reason": "", "nodes": "", "elapsed_s": None, "time_limit_s": None,
        "submit_time": 100, "comment": comment, "name": "rw-gen", "partition": "gpu",
        "stdout": None,
    }  # fmt: skip
    base.update(kw)
    return base


def test_the_active_job_of_a_run_wins_over_an_ended_later_one() -> None:
    views, _ = job_views(
        {
            "jobs": [
                job("7", "RUNNING", submit_time=100, nodes="n1", elapsed_s=42, time_limit_s=3600),
                job("9", "CANCELLED", submit_time=200),
                job("8", "RUNNING", comment="runwatch:other"),
                job("5", "RUNNING", comment="someone else's"),
            ]
        },
        {**owned("7"), **owned("9", submit_time=200), **owned("8", run="other")},
    )
    assert sorted(views) == ["gen", "other"]
    gen = views["gen"]
    assert gen.job_id == "7" and run_state(gen) == "running"
    assert gen.identity == {"job_id": "7", "submit_time": 100, "tag": "runwatch:gen"}
    assert describe(gen) == "job 7 RUNNING on n1, 42 s of 1 h"


def test_ended_jobs_leave_the_run_stopped_and_pending_shows_its_reason() -> None:
    ended = job_views(
        {"jobs": [job("3", "COMPLETED", submit_time=1), job("4", "FAILED")]},
        {**owned("3", submit_time=1), **owned("4")},
    ).runs
    assert ended["gen"].job_id == "4" and run_state(ended["gen"]) == "stopped"
    waiting = job_views({"jobs": [job("5", "PENDING", reason="Resources")]}, owned("5")).runs["gen"]
    assert run_state(waiting) == "pending" and describe(waiting) == "job 5 PENDING (Resources)"
    assert run_state(None) == "stopped"


def test_array_tasks_aggregate_per_run_and_per_dataset() -> None:
    tasks = [
        job("12_0", "RUNNING", array_job_id="12", array_task_id=0, nodes="n1", elapsed_s=10),
        job("12_1", "COMPLETED", array_job_id="12", array_task_id=1, nodes="n2", elapsed_s=30),
        job("12_[2-3]", "PENDING", array_job_id="12", reason="Priority"),
    ]
    view = job_views({"jobs": tasks}, owned("12")).runs["gen"]
    assert view.job_id == "12" and view.state == "RUNNING" and run_state(view) == "running"
    assert view.nodes == "n1,n2" and view.elapsed_s == 30
    assert [t.task for t in view.tasks] == [0, 1, None]
    assert describe(view).endswith("[1 completed, 1 pending, 1 running]")
    datasets = ["B1", "B2", "B3", "B4"]
    assert [dataset_alive(view, d, datasets) for d in datasets] == [True, False, False, False]
