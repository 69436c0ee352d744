"""The agent's Slurm ops against the real single-node cluster: list, submit, cancel."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent import slurm as slurmops
from supervisor.agent.protocol import AgentOpError
from supervisor.config import HostConfig
from supervisor.hosts import LocalHost
from tests.fixtures_slurm import SlurmCluster
from tests.waiting import wait_until

CHILD = """\
import json, signal, sys, time
if sys.argv[1] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[2], "w") as f:
    json.dump(sys.argv[3:], f)
while True:
    signal.pause()
"""


def _submit(
    tmp_path: Path, tag: str, *args: str, mode: str = "plain", **extra: Any
) -> dict[str, Any]:
    (tmp_path / "child.py").write_text(CHILD)
    params: dict[str, Any] = {
        "workdir": str(tmp_path),
        "argv": [sys.executable, "child.py", mode, str(tmp_path / "argv.json"), *args],
        "tag": tag,
        "name": f"rw-{tag.split(':', 1)[1]}",
        "script_path": ".runwatch/job.sh",
        "lock_path": ".runwatch/submit.lock",
        "options": {"output": str(tmp_path / "job-%j.log")},
        "settle_s": 10.0,
    }
    params.update(extra)
    return slurmops.slurm_submit(params)


def _ident(job: dict[str, Any]) -> dict[str, Any]:
    return {"job_id": job["job_id"], "submit_time": job["submit_time"], "tag": job["comment"]}


# --------------------------------------------------------------------------- parsing


def test_durations_and_times_parse() -> None:
    assert slurmops.parse_duration("1-02:03:04") == 93784
    assert slurmops.parse_duration("02:03:04") == 7384
    assert slurmops.parse_duration("3:04") == 184
    assert slurmops.parse_duration("30") == 1800
    assert slurmops.parse_duration("UNLIMITED") is None
    assert slurmops.parse_duration("bogus") is None
    assert slurmops.parse_time("N/A") is None
    assert slurmops.parse_time("2026-11-30T10:28:06") is not None


def test_scontrol_values_keep_their_spaces() -> None:
    line = (
        "JobId=7 JobName=a b Comment=runwatch:x y  StdErr=/d/e f.log StdIn=/dev/null "
        "StdOut=/d/o.log Power="
    )
    rec = slurmops.parse_scontrol_line(line)
    assert rec["JobName"] == "a b"
    assert rec["Comment"] == "runwatch:x y"
    assert rec["StdOut"] == "/d/o.log"
    assert rec["StdErr"] == "/d/e f.log"


def test_format_line_with_the_separator_in_a_comment_is_refused() -> None:
    good = slurmops._SEP.join(
        ["5", "5", "N/A", "RUNNING", "None", "vm", "1:02", "UNLIMITED", "2026-11-30T10:00:00",
         "2026-11-30T10:00:01", "0", "root", "rw", "/w", "name", "runwatch:r"]
    )  # fmt: skip
    bad = good + slurmops._SEP + "more"
    jobs, refused = slurmops.parse_format_lines(good + "\n" + bad + "\n")
    assert [j["job_id"] for j in jobs] == ["5"]
    assert jobs[0]["elapsed_s"] == 62 and jobs[0]["time_limit_s"] is None
    assert jobs[0]["array_job_id"] is None
    assert refused == [bad]


def test_batch_script_quotes_every_word() -> None:
    text = slurmops.batch_script(["python3", "x.py", "; touch /tmp/p", "$(id)", "a'b"])
    assert text.splitlines()[-1] == "exec python3 x.py '; touch /tmp/p' '$(id)' 'a'\"'\"'b'"
    with pytest.raises(AgentOpError, match="one line starting with '-'"):
        slurmops.batch_script(["x"], directives=["--mem=1G\nrm -rf ~"])


# --------------------------------------------------------------------------- the real cluster


def test_submit_runs_argv_verbatim_and_lists_the_job(
    slurm_env: SlurmCluster, tmp_path: Path, pwned_marker: Path
) -> None:
    hostile = [f"; touch {pwned_marker}", f"$(touch {pwned_marker})", f"`touch {pwned_marker}`",
               "a'b\"c", "-x", "spa ce", "ünï"]  # fmt: skip
    reply = _submit(tmp_path, "runwatch:verbatim", *hostile)
    job = reply["job"]
    try:
        assert reply["submitted"] and job["state"] == "RUNNING", reply
        assert job["comment"] == "runwatch:verbatim" and job["name"] == "rw-verbatim"
        argv_file = tmp_path / "argv.json"

        def written() -> list[str] | None:  # the job may be between its open and its write
            try:
                return list(json.loads(argv_file.read_text()))
            except (FileNotFoundError, ValueError):
                return None

        assert wait_until(written, timeout=15.0) == hostile
        assert not pwned_marker.exists()
        listed = slurmops.slurm_jobs({})
        fallback = slurmops.slurm_jobs({"force_format": True})
        assert listed["source"] == "json" and fallback["source"] == "format"
        for found in (listed, fallback):
            (mine,) = [j for j in found["jobs"] if j["job_id"] == job["job_id"]]
            assert mine["state"] == "RUNNING"
            assert mine["nodes"] == slurm_env.node
            assert mine["submit_time"] == job["submit_time"]
            assert mine["stdout"] == str(tmp_path / f"job-{job['job_id']}.log")
            assert mine["workdir"] == str(tmp_path)
            assert mine["uid"] == os.getuid()
        again = _submit(tmp_path, "runwatch:verbatim")
        assert again["submitted"] is False and again["reason"] == "already-running"
    finally:
        slurm_env.run("scancel", job["job_id"], check=False)


def test_cancel_term_then_confirmed(slurm_env: SlurmCluster, tmp_path: Path) -> None:
    job = _submit(tmp_path, "runwatch:term")["job"]
    wait_until((tmp_path / "argv.json").exists, timeout=15.0)
    out = slurmops.slurm_cancel({"identity": _ident(job), "grace": 10.0})
    assert out["outcome"] == "terminated", out
    assert out["confirmed"] and out["signals"] == ["SIGTERM"]
    assert out["state"] in slurmops.TERMINAL_STATES
    again = slurmops.slurm_cancel({"identity": _ident(job), "grace": 10.0})
    assert again["outcome"] == "already-gone" and again["signals"] == []


def test_cancel_kills_a_job_that_ignores_term(slurm_env: SlurmCluster, tmp_path: Path) -> None:
    job = _submit(tmp_path, "runwatch:stubborn", mode="ignore-term")["job"]
    wait_until((tmp_path / "argv.json").exists, timeout=15.0)
    out = slurmops.slurm_cancel({"identity": _ident(job), "grace": 1.0})
    assert out["outcome"] == "killed", out
    assert out["signals"] == ["SIGTERM", "SIGKILL"] and out["confirmed"]
    assert out["after_s"] >= 1.0


def test_cancel_of_a_reused_or_foreign_job_id_is_refused(
    slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    job = _submit(tmp_path, "runwatch:victim")["job"]
    try:
        reused = dict(_ident(job), submit_time=job["submit_time"] - 60)
        out = slurmops.slurm_cancel({"identity": reused})
        assert out["outcome"] == "refused" and "reused" in out["detail"]
        foreign = dict(_ident(job), tag="runwatch:other")
        out = slurmops.slurm_cancel({"identity": foreign})
        assert out["outcome"] == "refused" and "not tagged" in out["detail"]
        assert slurm_env.job_state(job["job_id"]) == "RUNNING"
    finally:
        slurm_env.run("scancel", job["job_id"], check=False)


def test_pending_job_reports_its_reason_and_is_cancelled(
    slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    reply = _submit(tmp_path, "runwatch:held", options={"hold": True}, settle_s=2.0)
    job = reply["job"]
    assert job["state"] == "PENDING" and job["reason"] == "JobHeldUser", job
    out = slurmops.slurm_cancel({"identity": _ident(job)})
    assert out["outcome"] == "cancelled" and out["state"] == "CANCELLED", out


def test_array_tasks_listed_and_cancelled_together(slurm_env: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(CHILD)
    tasks = [[sys.executable, "child.py", "plain", str(tmp_path / f"t{i}.json"), f"ds{i}"]
             for i in range(2)]  # fmt: skip
    reply = slurmops.slurm_submit(
        {
            "workdir": str(tmp_path), "tasks": tasks, "tag": "runwatch:arr", "name": "rw-arr",
            "script_path": "job.sh", "lock_path": "submit.lock",
            "options": {"array": "0-1", "output": str(tmp_path / "arr-%A_%a.log")},
            "settle_s": 10.0,
        }
    )  # fmt: skip
    job_id = reply["job_id"]
    wait_until(lambda: all((tmp_path / f"t{i}.json").exists() for i in range(2)), timeout=20.0)
    assert json.loads((tmp_path / "t1.json").read_text()) == ["ds1"]
    jobs = [j for j in slurmops.slurm_jobs({})["jobs"] if j["array_job_id"] == job_id]
    assert sorted(j["array_task_id"] for j in jobs) == [0, 1]
    assert {j["stdout"] for j in jobs} == {str(tmp_path / f"arr-{job_id}_{i}.log") for i in (0, 1)}
    out = slurmops.slurm_cancel({"identity": _ident(dict(jobs[0], job_id=job_id))})
    assert out["outcome"] == "terminated" and out["confirmed"], out


async def test_real_replies_through_the_agent_fit_the_protocol_shapes(
    slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    from supervisor import replies
    from supervisor.agent import protocol
    from tests.e2e.test_agent_package import _misfit

    (tmp_path / "child.py").write_text(CHILD)
    host = LocalHost(HostConfig(name="login", local=True))
    async with host:
        assert {"slurm_jobs", "slurm_submit", "slurm_cancel"} <= set(host.hello["ops"])  # type: ignore[index]
        submitted = await host.request(
            "slurm_submit",
            {
                "workdir": str(tmp_path), "tag": "runwatch:shapes", "name": "rw-shapes",
                "argv": [sys.executable, "child.py", "plain", str(tmp_path / "a.json")],
                "script_path": "job.sh", "lock_path": "job.lock", "settle_s": 10.0,
                "options": {"output": "out/%j.log"},
            },
            timeout=60,
        )  # fmt: skip
        refused = await host.request(
            "slurm_submit",
            {"workdir": str(tmp_path), "tag": "runwatch:shapes", "name": "x", "argv": ["true"],
             "script_path": "job.sh", "lock_path": "job.lock"},
        )  # fmt: skip
        listed = {
            force: await host.request("slurm_jobs", {"all_states": True, "force_format": force})
            for force in (False, True)
        }
        job = submitted["job"]
        cancelled = await host.request("slurm_cancel", {"identity": _ident(job)}, timeout=60)
        for op, reply in [("slurm_submit", submitted), ("slurm_submit", refused),
                          ("slurm_jobs", listed[False]), ("slurm_jobs", listed[True]),
                          ("slurm_cancel", cancelled)]:  # fmt: skip
            why = _misfit(reply, protocol.OP_SHAPES[op][1], op)
            assert why is None, why
        assert replies.decode(submitted, replies.SlurmSubmit, "login", "x").job is not None
        assert replies.decode(refused, replies.SlurmSubmit, "login", "x").submitted is False
        assert replies.decode(cancelled, replies.SlurmCancel, "login", "x").confirmed
        assert (tmp_path / "out" / f"{job['job_id']}.log").exists()  # its directory was made


def test_listing_without_all_states_shows_only_active_jobs(
    slurm_env: SlurmCluster, tmp_path: Path
) -> None:
    job = _submit(tmp_path, "runwatch:ended")["job"]
    slurmops.slurm_cancel({"identity": _ident(job), "grace": 5.0})
    for force in (False, True):
        active = slurmops.slurm_jobs({"force_format": force})["jobs"]
        every = slurmops.slurm_jobs({"force_format": force, "all_states": True})["jobs"]
        assert job["job_id"] not in [j["job_id"] for j in active]
        assert job["job_id"] in [j["job_id"] for j in every]


def test_laptop_structs_mirror_the_slurm_shapes() -> None:
    from supervisor import replies
    from supervisor.agent import protocol
    from tests.e2e.test_agent_package import (
        test_each_laptop_struct_mirrors_its_protocol_shape as same,
    )

    for struct, shape in [
        (replies.SlurmJob, protocol.SlurmJob),
        (replies.SlurmJobs, protocol.SlurmJobsResult),
        (replies.SlurmSubmit, protocol.SlurmSubmitResult),
        (replies.SlurmCancel, protocol.SlurmCancelResult),
    ]:
        same(struct, shape)
