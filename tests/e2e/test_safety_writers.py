"""Invariant 3: one writer per dataset file. A launch (and so a restart's relaunch) is refused while
any process holds a dataset file open for writing or holds its lock, whoever it is: another user,
an unrecognised command line. A non-root agent says which users' processes it could not inspect.
Real processes, the real agent, a second Unix user."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from supervisor.errors import AgentError
from supervisor.hosts import Host
from tests.fixtures_procs import FakeRuns
from tests.fixtures_users import OtherUser

HOLD = r"""
import fcntl, os, signal, sys
mode, path = sys.argv[1], sys.argv[2]
if mode == "lock":
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
else:
    f = open(path, mode)
print("ok", flush=True)
signal.pause()
"""


class Holders:
    """Processes that hold a file open; every one is killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(
        self, mode: str, path: Path, prefix: Sequence[str] = (), python: str = sys.executable
    ) -> int:
        p = subprocess.Popen(
            [*prefix, python, "-c", HOLD, mode, str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ok", "the holder could not open the file"
        return p.pid

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=10)


@pytest.fixture
def holders() -> Iterator[Holders]:
    h = Holders()
    try:
        yield h
    finally:
        h.close()


def _run_dir(base: Path) -> tuple[Path, Path, Path]:
    """(workdir, data file, marker a launched command would create) under ``base`` (reachable by
    every user: the fake runs' directory), world-writable."""
    work = base / "w"
    data = work / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    for d in (work, work / "out", data.parent):
        d.chmod(0o777)
    data.write_text('{"sample_id": "1"}\n')
    data.chmod(0o666)
    return work, data, work / "launched"


def _launch_params(work: Path, marker: Path) -> dict[str, Any]:
    return {
        "workdir": str(work),
        "argv": [sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
        "log": "out/.runwatch/run.log",
        "lock_paths": ["out/.runwatch/B1.lock"],
        "data_files": ["out/B1/raw_responses.jsonl"],
        "settle_s": 0.2,
        "lock_wait_s": 0.2,
    }


async def test_inv3_launch_refuses_while_another_user_writes_a_dataset(
    host: Host, fake_runs: FakeRuns, holders: Holders, second_user: OtherUser
) -> None:
    work, data, marker = _run_dir(fake_runs.dir)
    writer = holders.start("a", data, second_user.prefix, second_user.python)
    reply = await host.request("launch", _launch_params(work, marker))
    assert reply["started"] is False and reply["reason"] == "writer-alive", reply
    assert [(h["pid"], h["user"], h["how"]) for h in reply["holders"]] == [
        (writer, second_user.name, ["write"])
    ]
    assert f"pid {writer} ({second_user.name}" in reply["detail"]
    assert not marker.exists(), "the command was started beside a live writer"


async def test_inv3_an_unrecognised_command_line_writing_a_dataset_blocks_a_launch(
    host: Host, fake_runs: FakeRuns, holders: Holders
) -> None:
    work, data, marker = _run_dir(fake_runs.dir)
    holders.start("r", data)  # a reader (tail -f) is no writer
    reply = await host.request("launch", _launch_params(work, marker))
    assert reply["started"] is False and reply["reason"] == "exited", reply  # it ran and ended
    assert marker.exists()
    marker.unlink()
    writer = holders.start("r+", data)  # O_RDWR, an argv runwatch does not recognise
    reply = await host.request("launch", _launch_params(work, marker))
    assert reply["reason"] == "writer-alive" and [h["pid"] for h in reply["holders"]] == [writer]
    assert not marker.exists()


async def test_inv3_a_process_holding_the_lock_blocks_a_launch(
    host: Host, fake_runs: FakeRuns, holders: Holders, second_user: OtherUser
) -> None:
    work, _, marker = _run_dir(fake_runs.dir)
    lock = work / "out" / ".runwatch" / "B1.lock"
    lock.parent.mkdir(mode=0o700)
    locker = holders.start("lock", lock)
    reply = await host.request("launch", _launch_params(work, marker))
    assert reply["started"] is False and reply["reason"] == "already-running", reply
    assert f"pid {locker} (" in reply["detail"]
    assert not marker.exists()
    # A ``.runwatch`` another user can write (where its lock could be) is refused outright:
    # nothing of runwatch's is kept where another user can swap it (T15).
    lock.parent.chmod(0o777)
    with pytest.raises(AgentError, match=r"writable by group or others \(mode 0777\)"):
        await host.request("launch", _launch_params(work, marker))
    lock.parent.chmod(0o700)
    os.chown(lock.parent, second_user.uid, second_user.gid)
    with pytest.raises(AgentError, match=f"owned by uid {second_user.uid}"):
        await host.request("launch", _launch_params(work, marker))
    assert not marker.exists()


def test_inv3_a_non_root_agent_names_the_users_it_could_not_inspect(
    fake_runs: FakeRuns, holders: Holders, second_user: OtherUser
) -> None:
    _, data, _ = _run_dir(fake_runs.dir)
    holders.start("a", data)  # root's writer: invisible to the second user
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]);"
        "from supervisor.agent.datafiles import file_holders;"
        "print(json.dumps(file_holders([sys.argv[2]])))"
    )
    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [*second_user.prefix, second_user.python, "-I", "-c", code, repo, str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    found = json.loads(done.stdout)
    assert found["pids"] == []
    users = {u["user"]: u for u in found["uninspected"]}
    assert "root" in users and users["root"]["pids"], found
    assert "could not inspect the processes of root" in found["detail"]
    assert f"as {second_user.name}" in found["detail"]


async def test_inv3_restart_refuses_before_the_stop_while_another_user_writes(
    fake_runs: FakeRuns,
    state_home: Path,
    slow_endpoint: Any,
    kill_runs_in: list[Path],
    holders: Holders,
    second_user: OtherUser,
) -> None:
    """Another user's process writes a dataset file of a running run: the restart is refused at
    its ``writers`` check, before the stop (the run keeps running, nothing is signalled), and a
    kill of the run stops the run's own processes only: the other user's writer is not the run's
    (invariant 8 stops holders of the run's user, never another user's)."""
    from supervisor.plan import make_plan
    from supervisor.steps import execute
    from tests.fixtures_actions import DemoRun, engine_for, pid_alive, why
    from tests.waiting import wait_until

    demo = DemoRun(fake_runs.dir / "writers", slow_endpoint.url, max_samples=300)
    kill_runs_in.append(demo.workdir)
    async with engine_for(demo) as engine:
        started = await execute(engine, await make_plan(engine, "demo", action="launch"))
        assert started.ok and started.identity is not None, why(started)
        pid = int(started.identity["pid"])
        data = demo.data_file("B1")
        wait_until(lambda: len(demo.complete_ids("B1")) >= 1, timeout=60)
        data.chmod(0o666)
        writer = holders.start("a", data, second_user.prefix, second_user.python)

        result = await execute(engine, await make_plan(engine, "demo", action="restart"))
        failed = result.failed_step
        assert not result.ok and failed is not None and failed.name == "writers", why(result)
        assert f"pid {writer} ({second_user.name}" in failed.detail
        assert "nothing was stopped" in failed.detail
        assert [s.state for s in result.steps if s.name in ("stop", "launch")] == [
            "pending",
            "pending",
        ]
        assert pid_alive(pid) and pid_alive(writer)

        snap = await engine.refresh()
        [rv] = [r for h in snap.hosts for r in h.runs if r.name == "demo"]
        assert rv.process is not None and rv.process.identity.pid == pid
        report = await engine.kill(rv.host, rv.process.identity, 5.0, run="demo")
        assert report.all_gone and not pid_alive(pid)
        assert pid_alive(writer), "the kill stopped another user's process"
        assert writer not in {r.pid for r in report.results}
