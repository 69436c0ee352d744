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


def test_a_requeued_job_stays_its_runs_by_the_nonce_of_its_comment() -> None:
    tag = "runwatch:gen:0123456789abcdef"
    rec = {"7": OwnedJob(run="gen", host="login", job_id="7", submit_time=100, how="submitted",
                         time=0.0, nonce="0123456789abcdef")}  # fmt: skip
    # requeued: the same id and comment, a new submit time
    again = job_views({"jobs": [job("7", "PENDING", comment=tag, submit_time=250)]}, rec)
    assert again.runs["gen"].job_id == "7" and again.foreign == {}
    # the id reused by a job with another nonce (or none) is not the run's, whatever its time
    for comment in ("runwatch:gen:fedcba9876543210", "runwatch:gen"):
        other = job_views({"jobs": [job("7", "RUNNING", comment=comment, submit_time=100)]}, rec)
        assert other.runs == {} and [v.job_id for v in other.foreign["gen"]] == ["7"]
    # a record without a nonce (adopted, or written before nonces) is judged by its submit time
    assert job_views({"jobs": [job("7", "RUNNING", submit_time=100)]}, owned("7")).runs
    assert not job_views({"jobs": [job("7", "RUNNING", submit_time=250)]}, owned("7")).runs


def test_the_watcher_says_once_that_a_runs_job_was_requeued() -> None:
    from supervisor.config import Config, HostConfig, RunConfig
    from supervisor.events import EventTracker
    from supervisor.model import HostView, JobView, RunView, Snapshot

    config = Config(hosts=[HostConfig(name="login", kind="slurm")],
                    runs=[RunConfig(name="gen", host="login", workdir="/w",
                                    argv=["python3", "gen.py"])])  # fmt: skip
    tag = "runwatch:gen:0123456789abcdef"

    def snap(submit_time: int, state: str, comment: str = tag) -> Snapshot:
        view = JobView(job_id="7", submit_time=submit_time, tag=comment, state=state)
        run = RunView(name="gen", host="login", state="running", job=view)
        return Snapshot(time=0.0, hosts=[HostView(name="login", connected=True, runs=[run])])

    tracker = EventTracker(config)
    seen = [tracker.update(s) for s in (snap(100, "RUNNING"), snap(250, "PENDING"),
                                        snap(250, "RUNNING"), snap(250, "RUNNING"))]  # fmt: skip
    requeued = [e for events in seen for e in events if e.kind == "job-requeued"]
    assert len(requeued) == 1 and requeued[0].run == "gen", seen
    assert "job 7 was requeued" in requeued[0].message and "PENDING" in requeued[0].message
    assert requeued[0].command == "runwatch status gen"
    # another job under the run (a new submission) is no requeue
    assert not [e for e in tracker.update(snap(400, "RUNNING", "runwatch:gen:fedcba9876543210"))
                if e.kind == "job-requeued"]  # fmt: skip
