"""What a unit holds whatever its members do to it (O17): the client's zombie keeps its pid,
group and session until the unit ends; a waiter a member stopped or traced is continued by the
stop; a member that leaves the cgroup and kills the waiter is stopped where the waiter last saw
it and the stop is never "confirmed"; a token holder started by a daemon outside the tree is a
member; another user's process carrying the token is not. Real processes, the real agent, a
real cgroup v2 leaf (as root), the launch-token path and a real second Unix user."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from supervisor.engine import Engine
from tests import fixtures_actions as actions
from tests.e2e import test_units
from tests.e2e.test_units import (
    CGROUP_MOUNT,
    _ended,
    launched,
    mygen_config,
    run_toml,
    snapshot_run,
    token_holders,
)
from tests.fixtures_actions import why
from tests.fixtures_config import write_local_config
from tests.fixtures_users import OtherUser
from tests.waiting import wait_for_async, wait_until

held_by = test_units.held_by
"""Each test twice: in a cgroup v2 leaf and on the launch-token path."""
stop_units = test_units.stop_units
"""Launch ids whose token holders are killed at teardown."""

WRITE = r"""
import ctypes, json, os, signal, sys, time
OUT = os.path.abspath(os.path.join("out", "B1", "raw_responses.jsonl"))
os.makedirs(os.path.dirname(OUT), exist_ok=True)
def write_forever(tag, after_each=None):
    n = 0
    while True:
        n += 1
        with open(OUT, "a") as f:
            f.write(json.dumps({"sample_id": "%s-%d-%d" % (tag, os.getpid(), n),
                                "output_ids": [1], "prompt_tokens": 1, "completion_tokens": 1,
                                "finish_reason": "stop"}) + "\n")
        if after_each is not None:
            after_each()
        time.sleep(0.05)
def mark(name, value):
    with open(name + ".tmp", "w") as f:
        f.write(str(value))
    os.replace(name + ".tmp", name)
"""


def _stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] not in "ZX"


def _record(launch_id: str) -> dict[str, Any]:
    path = Path(os.environ["XDG_STATE_HOME"]) / "runwatch" / "units" / f"{launch_id}.json"
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _marked(work: Path, name: str) -> int:
    wait_until(lambda: (work / name).exists(), timeout=30, what=f"the client's mark {name}")
    return int((work / name).read_text())


# The client starts a worker in a session of its own that writes, then exits 0.
LEAVES_A_WORKER = r"""
if os.fork() == 0:
    os.setsid()
    mark("worker.pid", os.getpid())
    write_forever("worker")
while not os.path.exists("worker.pid"):
    time.sleep(0.01)
sys.exit(0)
"""


async def test_o17_the_clients_zombie_keeps_its_pid_until_the_unit_ends(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """The client exits 0 while its worker (in a session of its own) goes on: its exit is
    recorded at once, but its pid stays the waiter's zombie, so no other process can get that
    pid, group or session id while the unit lives; the stop ends the unit and only then is the
    zombie reaped."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + LEAVES_A_WORKER)
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        lid = rv.last_unit.launch_id
        worker = await asyncio.to_thread(_marked, work, "worker.pid")
        await asyncio.to_thread(wait_until, lambda: "exit" in _record(lid), 30)
        record = _record(lid)
        client, waiter = int(record["child"]["pid"]), int(record["waiter"]["pid"])
        assert record["exit"] == {"code": 0, "signal": None}, record
        assert record["state"] == "running", record
        fields = _stat(client)
        assert fields and fields[0] == "Z" and int(fields[1]) == waiter, fields
        # The kernel does not give the client's pid to a new process while its zombie is kept.
        last = Path("/proc/sys/kernel/ns_last_pid")
        if os.geteuid() == 0 and last.exists():
            last.write_text(str(client - 1))
            decoy = os.fork()
            if decoy == 0:
                os._exit(0)
            os.waitpid(decoy, 0)
            assert decoy != client
        now = await snapshot_run(engine, "r")
        assert now.state == "running", now.state_text
        assert now.process is not None and now.process.identity.pid == worker
        report = await engine.kill("here", now.process.identity, grace=1.0, run="r")
        assert report.all_gone, (report.unit_detail, report.results)
        assert not _alive(worker)
        await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
        await asyncio.to_thread(wait_until, lambda: not _stat(client), 30)
        ended = await snapshot_run(engine, "r")
        assert ended.state == "stopped" and ended.ending == "stopped", ended.last_unit


# The client stops its own waiter (SIGSTOP, again after each record; or a ptrace attach), then
# writes.
STOPS_ITS_WAITER = r"""
if os.environ["MODE"] == "ptrace":
    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_ATTACH = 16
    if libc.ptrace(ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(os.getppid()), None, None) != 0:
        sys.exit("ptrace: %s" % os.strerror(ctypes.get_errno()))
else:
    os.kill(os.getppid(), signal.SIGSTOP)
waiter = os.getppid()
mark("stopped", waiter)
def stop_the_waiter_again():
    # It keeps its waiter stopped: a listing that continues it is undone within a record.
    if os.environ["MODE"] == "sigstop" and os.getppid() == waiter:
        os.kill(waiter, signal.SIGSTOP)
write_forever("main", stop_the_waiter_again)
"""


@pytest.mark.parametrize("how", ["sigstop", "ptrace"])
async def test_o17_a_waiter_its_client_stopped_is_continued_and_the_kill_ends_the_unit(
    tmp_path: Path, held_by: str, stop_units: list[str], how: str
) -> None:
    """A client that stops its waiter (SIGSTOP, or traces it): the kill stops the run, the
    stopped waiter is continued, records the end and ends, and the run reads "stopped" in the
    status, a new launch goes ahead and a second kill finds nothing running — the same state
    everywhere, never "running (could not be listed)"."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + STOPS_ITS_WAITER)
    body = run_toml("r", work) + f'[runs.env]\nMODE = "{how}"\n'
    cfg = write_local_config(tmp_path / "rw.toml", body, python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        lid = rv.last_unit.launch_id
        waiter = await asyncio.to_thread(_marked, work, "stopped")
        assert waiter == int(_record(lid)["waiter"]["pid"])
        await asyncio.to_thread(wait_until, lambda: _stat(waiter)[:1] in (["T"], ["t"]), 30)
        now = await snapshot_run(engine, "r")
        assert now.state == "running" and now.process is not None, now.state_text
        report = await engine.kill("here", now.process.identity, grace=1.0, run="r")
        assert report.all_gone, (report.unit_detail, report.results)
        assert token_holders(lid) == []
        await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
        await asyncio.to_thread(wait_until, lambda: not _alive(waiter), 30)
        after = await snapshot_run(engine, "r")
        assert after.state == "stopped" and after.ending == "stopped", after.state_text
        assert after.process is None  # nothing for a kill to find: it says "not running"
        (work / "stopped").unlink()
        relaunched = await actions.launch(engine, "r")
        assert relaunched.ok, why(relaunched)
        fresh = await snapshot_run(engine, "r")
        assert fresh.last_unit is not None and fresh.last_unit.launch_id != lid
        stop_units.append(fresh.last_unit.launch_id)


async def test_o17_a_stopped_waiter_records_its_clients_death_by_another_hand(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """A client that stops its waiter, then dies by a SIGKILL runwatch did not send (the OOM
    killer, a `kill -9` by hand): the next listing continues the waiter, which records the
    death; the run reads "stopped", ended "died" with its signal, and the waiter is gone — never
    "running" with no process in it."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + STOPS_ITS_WAITER)
    body = run_toml("r", work) + '[runs.env]\nMODE = "sigstop"\n'
    cfg = write_local_config(tmp_path / "rw.toml", body, python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        lid = rv.last_unit.launch_id
        waiter = await asyncio.to_thread(_marked, work, "stopped")
        await asyncio.to_thread(wait_until, lambda: _stat(waiter)[:1] == ["T"], 30)
        client = int(_record(lid)["child"]["pid"])
        os.kill(client, signal.SIGKILL)

        # A listing (each refresh) continues the waiter; it then records the end by itself.
        async def recorded() -> bool:
            await engine.refresh()
            return bool(_ended(lid))

        await wait_for_async(recorded, 30, what="the waiter's record of the death", interval=0.2)
        after = await snapshot_run(engine, "r")
        assert after.state == "stopped" and after.ending == "died", after.last_unit
        assert after.state_detail is not None and "signal 9" in after.state_detail, after
        await asyncio.to_thread(wait_until, lambda: not _alive(waiter), 30)


# Root moves a child out of the unit's cgroup; it double-forks, leaves the session and execs a
# writer with an empty environment (no token); the client then kills its waiter.
ESCAPES_AND_KILLS_THE_WAITER = r"""
if "--escaped" in sys.argv:
    write_forever("escaped")
if os.fork() == 0:
    with open("/sys/fs/cgroup/unified/cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    mark("escaped", os.getpid())
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "--escaped"], {})
while not os.path.exists("escaped"):
    time.sleep(0.01)
if os.environ["MODE"] == "seen":
    while not os.path.exists("go"):
        time.sleep(0.01)
waiter = os.getppid()
os.kill(waiter, signal.SIGKILL)
mark("killed", waiter)
write_forever("main")
"""


@pytest.mark.parametrize("seen", ["seen", "unseen"])
async def test_o17_a_member_that_leaves_the_cgroup_and_kills_the_waiter_is_never_confirmed_gone(
    tmp_path: Path, stop_units: list[str], seen: str
) -> None:
    """On the cgroup path: the escaped writer is in no cgroup of the unit and carries no token.
    Once the waiter has recorded it, the stop kills it where it went (same boot and start
    time); whether or not it had, a stop whose waiter was killed is never reported confirmed."""
    if not (os.geteuid() == 0 and (CGROUP_MOUNT / "cgroup.procs").exists()):
        pytest.skip("needs root and cgroup v2 mounted at /sys/fs/cgroup/unified")
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + ESCAPES_AND_KILLS_THE_WAITER)
    body = run_toml("r", work) + f'[runs.env]\nMODE = "{seen}"\n'
    cfg = write_local_config(tmp_path / "rw.toml", body, python=True)
    from supervisor.config import load_config

    escaped = 0
    try:
        async with Engine(load_config(cfg)) as engine:
            rv = await launched(engine, "r", stop_units)
            assert rv.held_by == "cgroup"
            lid = rv.last_unit.launch_id
            escaped = await asyncio.to_thread(_marked, work, "escaped")
            if seen == "seen":
                start = int(_stat(escaped)[19])
                await asyncio.to_thread(
                    wait_until, lambda: [escaped, start] in (_record(lid).get("known") or []), 30
                )
                (work / "go").write_text("")
            waiter = await asyncio.to_thread(_marked, work, "killed")
            await asyncio.to_thread(wait_until, lambda: not _alive(waiter), 30)
            assert escaped not in token_holders(lid)
            cgroup = Path(_record(lid)["cgroup"])
            assert str(escaped) not in (cgroup / "cgroup.procs").read_text().split()
            now = await snapshot_run(engine, "r")
            assert now.process is not None, now.state_text
            report = await engine.kill("here", now.process.identity, grace=1.0, run="r")
            assert not report.all_gone, (report.unit_detail, report.results)
            assert "waiter" in (report.unit_detail or ""), report.unit_detail
            if seen == "seen":
                assert not _alive(escaped), "the escaped writer the waiter saw was not stopped"
    finally:
        if escaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(escaped, 9)


# A pre-existing spawner (an at/systemd-run/tmux-like daemon, outside every unit) starts what a
# request file asks, with the environment the request gives.
SPAWNER = r"""
import json, os, subprocess, sys, time
spool = sys.argv[1]
while True:
    for name in sorted(os.listdir(spool)):
        if name.endswith(".json"):
            path = os.path.join(spool, name)
            with open(path) as f:
                req = json.load(f)
            os.unlink(path)
            subprocess.Popen(req["argv"], cwd=req["cwd"], env=req["env"],
                             start_new_session=True)
    time.sleep(0.02)
"""

# The client asks the spawner to start its writer with its own environment, then exits 0.
ASKS_A_DAEMON = r"""
if "--writer" in sys.argv:
    mark("writer.pid", os.getpid())
    write_forever("writer")
req = {"argv": [sys.executable, os.path.abspath(__file__), "--writer"], "cwd": os.getcwd(),
       "env": dict(os.environ)}
spool = os.environ["SPOOL"]
with open(os.path.join(spool, "req.tmp"), "w") as f:
    json.dump(req, f)
os.replace(os.path.join(spool, "req.tmp"), os.path.join(spool, "req.json"))
while not os.path.exists("writer.pid"):
    time.sleep(0.01)
sys.exit(0)
"""


async def test_o17_a_token_holder_a_daemon_started_outside_the_tree_is_a_member(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """The client's writer is started by a daemon that is in no unit, with the client's
    environment (its token); the client exits 0. The run is running, never "finished
    (exit 0)", while the writer lives; the kill stops it, and only then is the unit over."""
    work = tmp_path / "work"
    work.mkdir()
    spool = tmp_path / "spool"
    spool.mkdir()
    (work / "run_inference.py").write_text(WRITE + ASKS_A_DAEMON)
    body = run_toml("r", work) + f'[runs.env]\nSPOOL = "{spool}"\n'
    cfg = write_local_config(tmp_path / "rw.toml", body, python=True)
    from supervisor.config import load_config

    daemon = subprocess.Popen(
        [sys.executable, "-c", SPAWNER, str(spool)],
        env={"PATH": os.environ["PATH"]},
        start_new_session=True,
    )
    writer = 0
    try:
        async with Engine(load_config(cfg)) as engine:
            rv = await launched(engine, "r", stop_units)
            lid = rv.last_unit.launch_id
            writer = await asyncio.to_thread(_marked, work, "writer.pid")
            await asyncio.to_thread(
                wait_until, lambda: _record(lid).get("exit") == {"code": 0, "signal": None}, 30
            )
            assert token_holders(lid) == [writer]
            assert int(_stat(writer)[1]) == daemon.pid  # outside the unit's tree
            now = await snapshot_run(engine, "r")
            assert now.state == "running", now.state_text
            assert now.process is not None and now.process.identity.pid == writer
            assert not _ended(lid)
            report = await engine.kill("here", now.process.identity, grace=1.0, run="r")
            assert report.all_gone, (report.unit_detail, report.results)
            assert not _alive(writer)
            await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
            ended = await snapshot_run(engine, "r")
            assert ended.state == "stopped" and ended.ending == "stopped", ended.last_unit
            assert daemon.poll() is None  # the daemon is no member: it was never signalled
    finally:
        daemon.kill()
        daemon.wait()
        if writer:
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, 9)


async def test_o17_another_users_process_carrying_the_token_is_no_member(
    tmp_path: Path, held_by: str, stop_units: list[str], second_user: OtherUser
) -> None:
    """A process of another user that carries a root run's launch token (its launch id is in
    the waiter's command line, readable by all): never listed, never signalled, and it does
    not keep the unit from ending."""
    cfg = mygen_config(
        tmp_path,
        "import time\nwhile True:\n    time.sleep(0.05)\n",
        "g",
        "out/g.jsonl",
        "settle_seconds = 0.5\nstop_grace_seconds = 1.0",
    )
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "g", stop_units)
        lid = rv.last_unit.launch_id
        token = _record(lid)["token"]
        stranger = subprocess.Popen(
            [*second_user.prefix, second_user.python, "-c", "import time; time.sleep(600)"],
            env={"PATH": os.environ["PATH"], "RUNWATCH_LAUNCH": token},
            cwd="/",
        )
        try:
            await asyncio.to_thread(wait_until, lambda: stranger.pid in token_holders(lid), 30)
            listed = await engine.host("here").request("units", {})
            unit = next(u for u in listed["units"] if u["launch_id"] == lid)
            assert stranger.pid not in unit["members"], unit
            now = await snapshot_run(engine, "g")
            assert now.process is not None
            report = await engine.kill("here", now.process.identity, grace=1.0, run="g")
            assert report.all_gone, (report.unit_detail, report.results)
            assert stranger.pid not in {r.pid for r in report.results}
            assert stranger.poll() is None, "root's kill signalled another user's process"
            await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
            ended = await snapshot_run(engine, "g")
            assert ended.state == "stopped", ended.state_text
        finally:
            stranger.kill()
            stranger.wait()
