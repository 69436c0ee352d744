"""O9 on Slurm: a run's jobs are the ones runwatch submitted or adopted, never the ones that only
carry its tag; actions on one run happen one after the other and each is audited; a job still
COMPLETING has not ended, whichever shape squeue's JSON gives its state in."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import slurm as slurmops
from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.errors import RunwatchError
from supervisor.runlock import lock_path
from supervisor.slurm import (
    KEEP_JOBS,
    OwnedJob,
    job_views,
    not_ours,
    owned_jobs,
    record_job,
    run_lock,
    run_state,
)
from tests.fixtures_actions import DemoRun, run_pids
from tests.fixtures_slurm import SlurmCluster
from tests.waiting import wait_until

LOGIN = '[[hosts]]\nname = "login"\nlocal = true\nkind = "slurm"\n'
NOT_OURS = "tagged runwatch:demo, not submitted or adopted by this runwatch"

# --------------------------------------------------------------------------- squeue --json shapes

# One job of ``squeue --json`` as each Slurm release writes it, cancelled while its processes are
# still being torn down (read from SchedMD/slurm at the tags slurm-22-05-8-1 .. slurm-25-05-1-1):
# - 22.05 (openapi/v0.0.38 ``jobs.c``): plain integers; ``job_state`` is ``job_state_string()``,
#   in which the COMPLETING flag wins over the base state;
# - 23.02 (data_parser/v0.0.39): ``UINT32_NO_VAL`` fields as ``{"set", "infinite", "number"}``,
#   times still plain; ``job_state`` still a string;
# - 23.11 .. 25.05 (data_parser/v0.0.40 .. v0.0.43): times as ``TIMESTAMP_NO_VAL`` objects and
#   ``job_state`` a flag array, the base state first (``add_flag_eq``), then the flags.


def _no_val(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


UNSET = {"set": False, "infinite": False, "number": 0}
COMMON = {"job_id": 41, "comment": "runwatch:gen", "name": "rw-gen", "nodes": "n1",
          "partition": "gpu", "user_id": 1000, "user_name": "u", "state_reason": "None",
          "current_working_directory": "/w"}  # fmt: skip
SHAPES: dict[str, dict[str, Any]] = {
    "22.05": {**COMMON, "job_state": "COMPLETING", "array_job_id": 0, "array_task_id": None,
              "submit_time": 100, "start_time": 101, "end_time": 160, "time_limit": 30},
    "23.02": {**COMMON, "job_state": "COMPLETING", "array_job_id": _no_val(0),
              "array_task_id": UNSET, "submit_time": 100, "start_time": 101, "end_time": 160,
              "time_limit": _no_val(30)},
    "23.11": {**COMMON, "job_state": ["CANCELLED", "COMPLETING"], "array_job_id": _no_val(0),
              "array_task_id": UNSET, "submit_time": _no_val(100), "start_time": _no_val(101),
              "end_time": _no_val(160), "time_limit": _no_val(30)},
    "25.05": {**COMMON, "job_state": ["CANCELLED", "COMPLETING"], "array_job_id": _no_val(0),
              "array_task_id": UNSET, "submit_time": _no_val(100), "start_time": _no_val(101),
              "end_time": _no_val(160), "time_limit": _no_val(30)},
}  # fmt: skip
ENDED = {"22.05": "CANCELLED", "23.02": "CANCELLED", "23.11": ["CANCELLED"], "25.05": ["CANCELLED"]}


@pytest.mark.parametrize("version", sorted(SHAPES))
def test_o9_a_completing_job_has_not_ended_in_any_slurm_version(version: str) -> None:
    (job,) = slurmops.parse_json_jobs({"jobs": [SHAPES[version]]}, now=200.0)
    assert job["state"] == "COMPLETING"
    assert job["state"] not in slurmops.TERMINAL_STATES and job["state"] in slurmops.ACTIVE_STATES
    assert (job["job_id"], job["submit_time"], job["time_limit_s"]) == ("41", 100, 1800)
    assert job["array_job_id"] is None and job["comment"] == "runwatch:gen"
    # on the laptop: the run is still running, so no launch or restart submits another job
    owned = {"41": OwnedJob(run="gen", host="h", job_id="41", submit_time=100, how="submitted",
                            time=0.0)}  # fmt: skip
    view = job_views({"jobs": [job]}, owned).runs["gen"]
    assert run_state(view) == "running"
    (ended,) = slurmops.parse_json_jobs(
        {"jobs": [dict(SHAPES[version], job_state=ENDED[version])]}, now=200.0
    )
    assert ended["state"] == "CANCELLED" and ended["elapsed_s"] == 59
    assert run_state(job_views({"jobs": [ended]}, owned).runs["gen"]) == "stopped"


def test_o9_state_lists_read_as_squeue_prints_them() -> None:
    read = slurmops.json_state
    assert read(["CANCELLED", "COMPLETING"]) == "COMPLETING"
    assert read(["COMPLETED", "COMPLETING"]) == "COMPLETING"
    assert read(["FAILED", "STAGE_OUT"]) == "STAGE_OUT"  # its data still being staged out
    assert read(["RUNNING", "CONFIGURING", "POWER_UP_NODE"]) == "CONFIGURING"
    assert read(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert read(["RUNNING", "LAUNCH_FAILED"]) == "RUNNING"  # not a flag that hides the base
    assert read(["CANCELLED"]) == "CANCELLED" and read([]) == "" and read("RUNNING") == "RUNNING"
    for flag in ("COMPLETING", "STAGE_OUT", "SIGNALING", "STOPPED", "REQUEUE_HOLD"):
        assert flag in slurmops.ACTIVE_STATES and flag not in slurmops.TERMINAL_STATES


def test_o9_one_array_task_still_completing_keeps_the_job_from_having_ended() -> None:
    tasks = [{"state": "CANCELLED"}, {"state": "STAGE_OUT"}, {"state": "CANCELLED"}]
    assert slurmops.aggregate_state(tasks) == "STAGE_OUT"
    assert slurmops.aggregate_state([{"state": "CANCELLED"}, {"state": "COMPLETING"}]) == (
        "COMPLETING"
    )
    assert slurmops.aggregate_state([{"state": "CANCELLED"}, {"state": "FAILED"}]) == "CANCELLED"


def test_o9_only_recorded_jobs_are_a_runs_and_a_tag_alone_is_shown_as_foreign() -> None:
    def rec(job_id: str, run: str, submit_time: int | None, how: Any = "submitted") -> OwnedJob:
        return OwnedJob(run=run, host="h", job_id=job_id, submit_time=submit_time, how=how,
                        time=0.0)  # fmt: skip

    def line(job_id: str, comment: str, submit_time: int = 100, state: str = "RUNNING") -> Any:
        return {"job_id": job_id, "array_job_id": None, "array_task_id": None, "state": state,
                "submit_time": submit_time, "comment": comment}  # fmt: skip

    reply = {
        "jobs": [
            line("5", "runwatch:gen"),  # someone else's, with the run's tag
            line("6", "by hand"),  # adopted: no tag needed
            line("7", "runwatch:other", submit_time=300),  # an id reused since it was recorded
            line("8", "runwatch:gen", state="COMPLETED"),  # foreign and ended: nothing to say
        ]
    }
    owned = {"6": rec("6", "gen", 100, "adopted"), "7": rec("7", "other", 200)}
    jobs = job_views(reply, owned)
    assert sorted(jobs.runs) == ["gen"] and jobs.runs["gen"].job_id == "6"
    assert jobs.runs["gen"].identity == {"job_id": "6", "submit_time": 100, "tag": "by hand"}
    assert {r: [v.job_id for v in vs] for r, vs in jobs.foreign.items()} == {
        "gen": ["5", "8"], "other": ["7"]
    }  # fmt: skip
    assert not_ours(jobs.foreign["gen"]) == (
        "job 5 tagged runwatch:gen, not submitted or adopted by this runwatch"
    )
    assert not_ours([]) is None


def test_o9_the_record_of_a_runs_jobs_is_private_bounded_and_per_config(
    tmp_path: Path, state_home: Path
) -> None:
    one = DemoRun(tmp_path / "one", "http://127.0.0.1:9", host_toml=LOGIN, host_name="login")
    two = DemoRun(tmp_path / "two", "http://127.0.0.1:9", host_toml=LOGIN, host_name="login")
    first, second = one.config, two.config
    for n in range(KEEP_JOBS + 5):
        record_job(first, "demo", "login", str(100 + n), 1000 + n, "submitted")
    record_job(second, "demo", "login", "7", 7, "adopted")
    record_job(first, "demo", "other-login", "7", 8, "submitted")
    kept = owned_jobs(first, "login")
    assert sorted(kept) == [str(100 + n) for n in range(5, KEEP_JOBS + 5)]  # the newest
    assert kept["124"].submit_time == 1024 and kept["124"].how == "submitted"
    assert list(owned_jobs(second, "login")) == ["7"]  # the same run name in another config
    assert owned_jobs(first, "other-login")["7"].submit_time == 8  # and on another host
    # the same config through a link is the same config
    (tmp_path / "link.toml").symlink_to(one.config_path)
    assert sorted(owned_jobs(load_config(tmp_path / "link.toml"), "login")) == sorted(kept)
    files = sorted((state_home / "slurm").glob("*/jobs.json"))
    assert len(files) == 2
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600 and f.parent.stat().st_mode & 0o777 == 0o700
        assert json.loads(f.read_text())["config"] in (
            str(one.config_path.resolve()), str(two.config_path.resolve())
        )  # fmt: skip


async def test_o9_an_action_waits_for_the_runs_lock_then_refuses_naming_its_holder(
    tmp_path: Path, state_home: Path
) -> None:
    config = DemoRun(tmp_path, "http://127.0.0.1:9", host_toml=LOGIN, host_name="login").config
    told: list[str] = []
    async with run_lock(config, "demo", 1.0):
        with pytest.raises(RunwatchError) as refused:
            async with run_lock(config, "demo", 0.3, told.append):
                raise AssertionError("two holders of one run's lock")
        async with run_lock(config, "other", 0.3):  # another run is not held up
            pass
    # The holder is named: what it does, who and from where.
    (waiting,) = told
    assert waiting.startswith("run demo: waiting for another runwatch action on it (slurm by ")
    assert f", pid {os.getpid()}, " in waiting
    assert "has held its lock for more than 0.3 s" in str(refused.value)
    assert f", pid {os.getpid()}, " in str(refused.value)
    async with run_lock(config, "demo", 0.3):  # released with its holder
        pass


# --------------------------------------------------------------------------- the real cluster


def runwatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip


def audit_of(state_home: Path) -> list[dict[str, Any]]:
    path = state_home / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def submit_by_hand(cluster: SlurmCluster, script: Path, *options: str) -> str:
    """``sbatch`` as a person would (no runwatch): the job id."""
    out = cluster.run(
        "sbatch", "--parsable", f"--chdir={script.parent}",
        f"--output={script.parent / 'hand-%j.log'}", *options, str(script),
    )  # fmt: skip
    job_id = out.stdout.strip().split(";")[0]
    wait_until(lambda: cluster.job_state(job_id) == "RUNNING", timeout=30.0, what="job running")
    return job_id


def _status_run(cfg: str) -> dict[str, Any]:
    out = runwatch("status", "-c", cfg, "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["hosts"][0]["runs"][0])


def test_o9_a_tagged_job_submitted_by_hand_is_never_cancelled_until_adopted(
    tmp_path: Path, state_home: Path, slurm_env: SlurmCluster, slurm_job_script: Path
) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9", host_toml=LOGIN, host_name="login")
    cfg = str(demo.config_path)
    job_id = submit_by_hand(slurm_env, slurm_job_script, "--comment=runwatch:demo")

    run = _status_run(cfg)
    assert run["state"] == "stopped" and run["job"] is None
    assert run["state_detail"] == f"job {job_id} {NOT_OURS}"
    ps = runwatch("ps", "-c", cfg)
    assert f"job {job_id}" in ps.stdout and "(tagged runwatch:demo, not submitted" in ps.stdout

    killed = runwatch("kill", "demo", "-c", cfg, "--yes")
    assert killed.returncode != 0
    assert f"job {job_id} {NOT_OURS}: not cancelled" in killed.stderr
    assert f"runwatch adopt demo --job {job_id}" in killed.stderr
    restarted = runwatch("restart", "demo", "-c", cfg, "--yes", "--json")
    steps = {s["name"]: s for s in json.loads(restarted.stdout)["steps"]}
    assert steps["stop"]["state"] == "skipped"  # no job of the run's: nothing is cancelled
    assert steps["launch"]["state"] == "failed"  # and no second job beside the tagged one
    assert f"job {job_id} (RUNNING) is tagged runwatch:demo" in steps["launch"]["detail"]
    assert "runwatch adopt demo" in steps["launch"]["detail"]
    assert slurm_env.job_state(job_id) == "RUNNING" and job_id in slurm_env.jobs()
    (refused,) = [a for a in audit_of(state_home) if a["action"] == "kill"]
    assert refused["ok"] is False and refused["outcome"] == "refused"
    assert refused["identity"]["job_id"] == job_id

    refused_adopt = runwatch("adopt", "demo", "-c", cfg, "--job", job_id)
    assert refused_adopt.returncode != 0 and "--yes" in refused_adopt.stderr  # no terminal
    adopted = runwatch("adopt", "demo", "-c", cfg, "--job", job_id, "--yes", "--json")
    assert adopted.returncode == 0, adopted.stderr
    assert json.loads(adopted.stdout)["job_id"] == job_id
    assert f"job {job_id}: job {job_id} RUNNING on {slurm_env.node}" in adopted.stderr
    again = runwatch("adopt", "demo", "-c", cfg, "--job", job_id, "--yes")
    assert again.returncode != 0 and "already run demo's (adopted)" in again.stderr
    kept = state_home / "slurm"
    (record,) = kept.glob("*/jobs.json")
    assert record.stat().st_mode & 0o777 == 0o600 and record.parent.stat().st_mode & 0o777 == 0o700
    assert _status_run(cfg)["job"]["job_id"] == job_id

    killed = runwatch("kill", "demo", "-c", cfg, "--yes", "--json", "--grace", "5")
    assert killed.returncode == 0, killed.stderr + killed.stdout
    (out,) = json.loads(killed.stdout)["results"]
    assert out["outcome"] == "terminated" and out["confirmed"] is True
    assert slurm_env.job_state(job_id) in slurmops.TERMINAL_STATES
    actions = [(a["action"], a["ok"], a.get("outcome")) for a in audit_of(state_home)]
    assert actions[-2:] == [("adopt", True, None), ("kill", True, "terminated")]


def test_o9_three_concurrent_kills_cancel_once_and_audit_every_outcome(
    tmp_path: Path,
    state_home: Path,
    slow_endpoint: Any,
    slurm_env: SlurmCluster,
    kill_runs_in: list[Path],
) -> None:
    demo = DemoRun(
        tmp_path, slow_endpoint.url, max_samples=300, host_toml=LOGIN, host_name="login",
        run_toml='stop_grace_seconds = 5.0\n[runs.slurm]\ntime = "10"\n',
    )  # fmt: skip
    kill_runs_in.append(demo.workdir)
    cfg = str(demo.config_path)
    launched = runwatch("launch", "demo", "-c", cfg, "--yes", "--json")
    assert launched.returncode == 0, launched.stderr + launched.stdout
    job_id = json.loads(launched.stdout)["identity"]["job_id"]
    wait_until(lambda: run_pids(demo.workdir), timeout=30.0, what="the client to run")

    # Another action on the run holds its lock while the three kills look at the job: each
    # sees it running, then waits; released, they go one at a time.
    fd = os.open(lock_path(load_config(cfg), "demo"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    procs, errs = [], []
    try:
        for i in range(3):
            errs.append(tmp_path / f"kill{i}.err")
            with open(errs[-1], "w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "supervisor.cli", "kill", "demo", "-c", cfg, "--yes",
                     "--json"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True,
                ))  # fmt: skip
        wait_until(
            lambda: all("waiting for another runwatch action" in e.read_text() for e in errs),
            timeout=120.0,
            what="the three kills to wait for the run's lock",
        )
    finally:
        os.close(fd)
    results = []
    for p in procs:
        stdout, _ = p.communicate(timeout=180)
        assert p.returncode == 0, stdout
        results += json.loads(stdout)["results"]
    assert sorted(r["outcome"] for r in results) == ["already-gone", "already-gone", "terminated"]
    assert all(r["confirmed"] and r["job_id"] == job_id for r in results)
    assert [r["signals"] for r in results if r["outcome"] == "already-gone"] == [[], []]
    assert run_pids(demo.workdir) == [] and slurm_env.job_state(job_id) in slurmops.TERMINAL_STATES
    kills = [a for a in audit_of(state_home) if a["action"] == "kill"]
    assert sorted(a["outcome"] for a in kills) == ["already-gone", "already-gone", "terminated"]
    assert all(a["ok"] and a["identity"]["job_id"] == job_id for a in kills)


async def test_o9_a_cancel_that_fails_is_audited(
    tmp_path: Path,
    state_home: Path,
    slurm_env: SlurmCluster,
    slurm_job_script: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    demo = DemoRun(tmp_path, "http://127.0.0.1:9", host_toml=LOGIN, host_name="login")
    job_id = submit_by_hand(slurm_env, slurm_job_script)  # no tag: adopted all the same
    # A login node whose scancel is missing: the agent's commands and every Slurm one but that.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sh", "python3", "squeue", "scontrol", "sacct", "sbatch"):
        found = shutil.which(name)
        if found is not None:
            (bin_dir / name).symlink_to(found)
    with monkeypatch.context() as patch:  # only while the engine acts (not at teardown)
        patch.setenv("PATH", str(bin_dir))
        engine = Engine(demo.config)
        try:
            shown = await engine.find_job("demo", job_id)
            assert shown.tag == "" and shown.state == "RUNNING"
            await engine.adopt_job("demo", shown)
            with pytest.raises(RunwatchError, match="scancel not found"):
                await engine.cancel_job("demo", 1.0)
        finally:
            await engine.aclose()
    assert slurm_env.job_state(job_id) == "RUNNING"
    failed = audit_of(state_home)[-1]
    assert failed["action"] == "kill" and failed["ok"] is False and failed["outcome"] == "error"
    assert failed["identity"]["job_id"] == job_id
    assert "scancel failed: login: slurm_cancel failed" in failed["steps"][0]["detail"]
    assert "scancel not found" in failed["steps"][0]["detail"]


def test_o9_scancel_of_a_job_slurm_forgot_is_not_a_failure(slurm_env: SlurmCluster) -> None:
    unknown = str(max([int(j) for j in slurm_env.jobs()] + [0]) + 900000)
    slurmops._scancel(["--signal=TERM", "--full", unknown])  # "Invalid job id": nothing to do
    out = slurmops.slurm_cancel({"identity": {"job_id": unknown, "submit_time": 1, "tag": ""}})
    assert out["outcome"] == "already-gone" and out["signals"] == [] and out["confirmed"]


STUBBORN = """\
import os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    signal.pause()
"""


def test_o9_a_job_already_completing_is_confirmed_only_once_its_processes_are_gone(
    slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    pid_file = tmp_path / "pid"
    reply = slurmops.slurm_submit(
        {
            "workdir": str(tmp_path), "tag": "runwatch:gen", "name": "rw-gen",
            "argv": [sys.executable, "stubborn.py", str(pid_file)],
            "script_path": "job.sh", "lock_path": "job.lock", "settle_s": 10.0,
            "options": {"output": str(tmp_path / "job-%j.log")},
        }
    )  # fmt: skip
    job = reply["job"]
    wait_until(pid_file.exists, timeout=30.0, what="the job's process")
    pid = int(pid_file.read_text())
    # Someone else's plain scancel: the job is CANCELLED and COMPLETING while slurmd waits
    # KillWait (5 s) for the process that ignores SIGTERM, then kills it.
    slurm_env.run("scancel", job["job_id"])
    wait_until(lambda: slurm_env.job_state(job["job_id"]) == "COMPLETING", timeout=5.0)
    out = slurmops.slurm_cancel(
        {"identity": {"job_id": job["job_id"], "submit_time": job["submit_time"],
                      "tag": "runwatch:gen"}, "grace": 1.0}
    )  # fmt: skip
    assert out["outcome"] == "already-gone" and out["signals"] == [], out
    assert out["confirmed"] and out["state"] in slurmops.TERMINAL_STATES
    assert not Path(f"/proc/{pid}").exists()  # confirmed only once the process was gone
    assert slurm_env.job_state(job["job_id"]) in slurmops.TERMINAL_STATES
