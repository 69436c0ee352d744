"""Ownership, not inference (O1, O2, O3, O8): every launch starts in a unit that holds all its
descendants whatever they do, a kill stops the unit whole and is confirmed only when it is empty,
and how a run ended is a recorded fact. Real processes, the real agent, a real cgroup v2 leaf
(as root) and the launch-token path (forced, and as a second Unix user without delegation)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from supervisor.engine import Engine
from supervisor.events import EventTracker
from tests import fixtures_actions as actions
from tests.fixtures_actions import launch, sha256_of, why
from tests.fixtures_config import write_local_config
from tests.fixtures_procs import FakeRuns
from tests.fixtures_users import OtherUser
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CGROUP_MOUNT = Path("/sys/fs/cgroup/unified")

# The records a stand-in client appends, one every 50 ms, opening and closing the file each time
# (no descriptor to find). ``WRITE`` is the loop; each mode below adds how the client misbehaves.
WRITE = r"""
import json, os, sys, time, signal
OUT = os.path.join("out", "B1", "raw_responses.jsonl")
os.makedirs(os.path.dirname(OUT), exist_ok=True)
def write_forever(tag):
    n = 0
    while True:
        n += 1
        rec = {"sample_id": "%s-%d-%d" % (tag, os.getpid(), n), "output_ids": [1, 2],
               "prompt_tokens": 3, "completion_tokens": 2, "finish_reason": "stop"}
        with open(OUT, "a") as f:
            f.write(json.dumps(rec) + "\n")
        time.sleep(0.05)
"""

MODES = {
    # SIGTERM: fork a child that calls setsid, closes every descriptor and keeps writing.
    "escape": r"""
def on_term(*_):
    if os.fork() == 0:
        os.setsid()
        os.closerange(0, 1024)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_forever("escaped")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
write_forever("main")
""",
    # At start: a double-forked setsid daemon that ignores SIGTERM writes; the client waits.
    "daemon": r"""
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.closerange(0, 1024)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write_forever("daemon")
    os._exit(0)
while True:
    signal.pause()
""",
    # Re-exec under another argv[0]: no argv element names the script any more.
    "rename": r"""
if not os.environ.get("RENAMED"):
    os.environ["RENAMED"] = "1"
    os.execv(sys.executable, ["renamed-worker", os.path.abspath(__file__)] + sys.argv[1:])
write_forever("renamed")
""",
    # Keeps its data file open (it writes on whatever happens to its working directory).
    "keepopen": r"""
f = open(OUT, "a")
while True:
    f.write("{}\n")
    f.flush()
    time.sleep(0.05)
""",
    # The main thread exits (pthread_exit) while another thread writes.
    "mainthread": r"""
import ctypes, threading
threading.Thread(target=write_forever, args=("thread",)).start()
ctypes.CDLL(None).pthread_exit(None)
""",
}


def client(workdir: Path, mode: str) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run_inference.py").write_text(WRITE + textwrap.dedent(MODES[mode]))


def finishing_client(workdir: Path, code: int) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run_inference.py").write_text(
        WRITE
        + textwrap.dedent(
            f"""
            with open(OUT, "a") as f:
                f.write(json.dumps({{"sample_id": "x", "output_ids": [1], "prompt_tokens": 1,
                                    "completion_tokens": 1, "finish_reason": "stop"}}) + "\\n")
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while not os.path.exists("go"):
                time.sleep(0.02)
            sys.exit({code})
            """
        )
    )


def run_toml(name: str, workdir: Path) -> str:
    return f"""
[[runs]]
name = "{name}"
host = "here"
workdir = "{workdir}"
argv = [{json.dumps(sys.executable)}, "run_inference.py", "--datasets", "B1", "--output-dir", "out"]
settle_seconds = 0.5
stop_grace_seconds = 1.0
"""


def token_holders(launch_id: str) -> list[int]:
    """Every process whose environment carries a launch token of ``launch_id``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f":{launch_id}".encode() in env and b"RUNWATCH_LAUNCH=" in env and state != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(params=["cgroup", "token"])
def held_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test twice: in a cgroup v2 leaf (root, this machine) and on the launch-token path."""
    mode = str(request.param)
    if mode == "cgroup" and not (os.geteuid() == 0 and (CGROUP_MOUNT / "cgroup.procs").exists()):
        pytest.skip("needs root and cgroup v2 mounted at /sys/fs/cgroup/unified")
    if mode == "token":
        monkeypatch.setenv("RUNWATCH_AGENT_NO_CGROUP", "1")
    return mode


@pytest.fixture
def stop_units() -> Any:
    """Launch ids to sweep at teardown: SIGKILL whatever still carries their token, then the
    unit's waiter if it is still there (one its client stopped stays stopped, holding the
    client's zombie, when nothing but this sweep ends the unit)."""
    from supervisor.agent import unit

    ids: list[str] = []
    yield ids
    for lid in ids:
        for pid in token_holders(lid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, 9)
        wait_until(lambda lid=lid: not token_holders(lid), timeout=10)  # type: ignore[misc]
        rec = unit.read_record(lid)
        if rec is not None and unit._waiter_alive(rec):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(rec["waiter"]["pid"]), signal.SIGKILL)


async def snapshot_run(engine: Engine, name: str) -> Any:
    snap = await engine.refresh()
    return next(r for h in snap.hosts for r in h.runs if r.name == name)


async def launched(engine: Engine, name: str, stop_units: list[str]) -> Any:
    result = await actions.launch(engine, name)
    assert result.ok, why(result)
    rv = await snapshot_run(engine, name)
    assert rv.last_unit is not None
    stop_units.append(rv.last_unit.launch_id)
    return rv


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


@pytest.mark.parametrize("mode", ["escape", "daemon", "rename", "mainthread"])
async def test_o1_o2_a_unit_is_stopped_whole_and_confirmed_only_when_empty(
    tmp_path: Path, held_by: str, mode: str, stop_units: list[str]
) -> None:
    work = tmp_path / "work"
    client(work, mode)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        lid = rv.last_unit.launch_id
        # Listed as the run and held by its unit, whatever its argv or main thread did.
        assert rv.state == "running", rv.state_text
        assert rv.held_by == held_by
        assert rv.process is not None and rv.process.unit is not None
        await asyncio.to_thread(wait_until, lambda: size(data) > 0, 30)
        if mode == "daemon":
            await asyncio.to_thread(wait_until, lambda: len(token_holders(lid)) >= 2, 30)
        report = await engine.kill("here", rv.process.identity, grace=1.0, run="r")
        assert report.held_by == held_by
        assert report.all_gone, report.results
        # Confirmed means empty: nothing carries the token, nothing writes any more, and the
        # unit's waiter has recorded the end (a launch right after is never refused for it).
        assert token_holders(lid) == []
        assert _ended(lid)
        after = await snapshot_run(engine, "r")
        assert after.state == "stopped"
        before = size(data)
        await asyncio.to_thread(wait_until, lambda: after.last_unit is not None and _ended(lid), 30)
        assert size(data) == before
        ended = await snapshot_run(engine, "r")
        assert ended.ending == "stopped", ended.last_unit
        if held_by == "cgroup":
            assert not (CGROUP_MOUNT / "runwatch" / lid).exists()


def _ended(launch_id: str) -> bool:
    state = Path(os.environ["XDG_STATE_HOME"]) / "runwatch" / "units" / f"{launch_id}.json"
    try:
        return json.loads(state.read_text()).get("state") == "ended"
    except (OSError, ValueError):
        return False


async def test_o1_a_restart_relaunches_only_after_the_daemon_is_gone(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    work = tmp_path / "work"
    client(work, "daemon")
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        old = rv.last_unit.launch_id
        await asyncio.to_thread(wait_until, lambda: len(token_holders(old)) >= 2, 30)
        result = await actions.restart(engine, "r")
        assert result.ok, why(result)
        assert token_holders(old) == []  # the old daemon did not survive the stop
        now = await snapshot_run(engine, "r")
        assert now.last_unit is not None and now.last_unit.launch_id != old
        stop_units.append(now.last_unit.launch_id)
        # One writer: every record since the relaunch comes from the new unit's processes.
        report = await engine.kill("here", now.process.identity, grace=1.0, run="r")
        assert report.all_gone


async def test_o3_twins_in_two_workdirs_each_stop_touches_only_its_unit(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    client(a, "escape")
    client(b, "escape")
    cfg = write_local_config(
        tmp_path / "rw.toml", run_toml("ra", a) + run_toml("rb", b), python=True
    )
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        ra = await launched(engine, "ra", stop_units)
        rb = await launched(engine, "rb", stop_units)
        b_pid = rb.process.identity.pid
        report = await engine.kill("here", ra.process.identity, grace=1.0, run="ra")
        assert report.all_gone
        assert b_pid not in {r.pid for r in report.results}
        assert token_holders(rb.last_unit.launch_id) == [b_pid]  # the twin never got a signal
        rb_now = await snapshot_run(engine, "rb")
        assert rb_now.state == "running" and rb_now.process.identity.pid == b_pid


@pytest.mark.parametrize(("code", "ending"), [(0, "finished"), (3, "died")])
async def test_o8_how_a_run_ended_is_recorded_not_guessed(
    tmp_path: Path, held_by: str, stop_units: list[str], code: int, ending: str
) -> None:
    work = tmp_path / "work"
    finishing_client(work, code)
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        detector = EventTracker(engine.config)
        rv = await launched(engine, "r", stop_units)
        snap = await engine.refresh()
        detector.update(snap)
        (work / "go").write_text("")
        lid = rv.last_unit.launch_id
        await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
        snap = await engine.refresh()
        events = detector.update(snap)
        now = next(r for r in snap.hosts[0].runs if r.name == "r")
        assert now.state == "stopped"
        assert now.ending == ending
        assert now.state_detail is not None and now.state_detail.startswith(ending)
        died = [e for e in events if e.kind == "run-died"]
        assert bool(died) == (ending == "died"), events


def test_o1_token_path_as_a_second_user_without_delegation(
    fake_runs: FakeRuns, second_user: OtherUser
) -> None:
    """An agent of a user who may not write the cgroup tree takes the token path, and its stop
    of an escaping client is confirmed only when nothing carries the token."""
    base = fake_runs.dir / "second"  # a directory every user can reach
    work = base / "work"
    client(work, "escape")
    state = base / "state"
    for p in (base, work, state):
        p.mkdir(exist_ok=True)
        os.chown(p, second_user.uid, second_user.gid)
    script = textwrap.dedent(
        f"""
        import json, sys
        from supervisor.agent import launch, unit
        r = launch.launch({{"workdir": {str(work)!r}, "argv": [sys.executable, "run_inference.py"],
                           "log": "run.log", "lock_paths": ["b1.lock"], "settle_s": 0.5,
                           "config_id": "c", "run": "r"}})
        assert r["started"], r
        units = unit.list_units({{}})["units"]
        stop = unit.stop({{"launch_id": r["launch_id"], "grace": 1.0}})
        print(json.dumps({{"held_by": r["held_by"], "members": units[0]["members"],
                          "stop": stop, "left": unit.members(unit.read_record(r["launch_id"]))}}))
        """
    )
    out = subprocess.run(
        [*second_user.prefix, second_user.python, "-c", script],
        cwd=work,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(state)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["held_by"] == "token"
    assert got["stop"]["confirmed"], got["stop"]
    assert got["left"] == []
    assert any(r["role"] == "child" for r in got["stop"]["results"]), got["stop"]


GEN = r"""
import json, os, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
os.makedirs(os.path.dirname(out), exist_ok=True)
n = 0
while True:
    n += 1
    rec = {"sample_id": "%d-%d" % (os.getpid(), n), "output_ids": [1, 2, 3, 4, 5],
           "prompt_tokens": 3, "completion_tokens": 5, "finish_reason": "stop"}
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    time.sleep(0.05)
"""


def mygen_config(tmp_path: Path, source: str, name: str, out: str, run_keys: str = "") -> Path:
    """``<tmp>/rw.toml``: run ``name`` of ``gen.py`` (``source``, written in ``<tmp>/work``)
    under a ``[clients.mygen]`` profile, writing ``out``; ``run_keys``: more TOML after the
    run's own keys (its settle and grace, an ``env`` table, datasets)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "gen.py").write_text(source)
    return write_local_config(
        tmp_path / "rw.toml",
        f"""
[[runs]]
name = "{name}"
host = "here"
workdir = "{work}"
argv = [{json.dumps(sys.executable)}, "gen.py", "--out", "{out}"]
client = "mygen"
{run_keys.strip()}

[clients.mygen]
scripts = ["gen.py"]
format = "raw"
[clients.mygen.flags]
output_file = ["--out"]
""",
        python=True,
    )


async def test_o2_a_profiled_run_of_any_script_is_counted_guarded_killed_and_restarted(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """A ``[clients.NAME]`` run of a script no built-in knows, launched by runwatch: listed,
    counted, stopped by the guard at its budget, restarted and killed, each through its unit."""
    from supervisor import audit
    from supervisor.config import load_config
    from supervisor.guard import BudgetGuard

    cfg = mygen_config(
        tmp_path,
        GEN,
        "mine",
        "out/x.jsonl",
        """
budget_policy = "stop"
settle_seconds = 0.5
stop_grace_seconds = 1.0

[datasets.x]
token_budget = 1000
""",
    )
    # 100 tokens a second: the restart comes well before the budget (a restart past it, with no
    # budget flag, is refused, as it should be), the guard's stop some seconds after.
    async with Engine(load_config(cfg)) as engine:
        first = await launched(engine, "mine", stop_units)
        assert first.state == "running" and first.held_by == held_by
        restarted = await actions.restart(engine, "mine")
        assert restarted.ok, why(restarted)
        assert token_holders(first.last_unit.launch_id) == []
        rv = await snapshot_run(engine, "mine")
        assert rv.state == "running" and rv.last_unit.launch_id != first.last_unit.launch_id
        stop_units.append(rv.last_unit.launch_id)
        guard = BudgetGuard(engine.config)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            snap = await engine.refresh()
            outcomes = await guard.enforce(engine, snap)
            if outcomes:
                break
            assert loop.time() < deadline, "the guard never acted"
            await asyncio.sleep(0.1)
        assert outcomes[0].ok, outcomes[0].detail
        counted = next(r for h in snap.hosts for r in h.runs if r.name == "mine")
        assert counted.datasets[0].records > 0
        assert token_holders(rv.last_unit.launch_id) == []
        stopped = await snapshot_run(engine, "mine")
        assert stopped.state == "stopped" and stopped.ending == "stopped"
    assert [e["action"] for e in audit.read()] == ["launch", "restart", "kill", "budget"]
    assert all(e["ok"] for e in audit.read())


async def test_o7_a_run_whose_workdir_was_replaced_is_still_running(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """The workdir removed and made anew under a live run: the run is still its unit, shown
    running, and a second launch is refused (it would be a second writer)."""
    import shutil

    from supervisor.config import load_config

    work = tmp_path / "work"
    client(work, "keepopen")
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        shutil.rmtree(work)
        client(work, "keepopen")
        now = await snapshot_run(engine, "r")
        assert now.state == "running", now.state_text
        assert now.process is not None and now.process.identity.pid == rv.process.identity.pid
        from supervisor.errors import LaunchError

        with pytest.raises(LaunchError, match="already running"):
            await actions.launch(engine, "r")
        assert token_holders(rv.last_unit.launch_id) == [rv.process.identity.pid]


# Variants found by an adversarial round on what landed first.

LEAVER = r"""
import json, os, sys, time
out = os.path.abspath(sys.argv[sys.argv.index("--out") + 1])
os.makedirs(os.path.dirname(out), exist_ok=True)
if "--escaped" not in sys.argv:
    if os.fork() == 0:
        if os.environ.get("LEAVE_CGROUP"):  # root may move itself to another cgroup
            with open("/sys/fs/cgroup/unified/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
        if os.environ.get("KILL_WAITER"):  # then leave the tree: double fork, setsid
            if os.fork():
                os._exit(0)
            os.setsid()
            if os.fork():
                os._exit(0)
        with open(out + ".escaped", "w") as f:
            f.write(str(os.getpid()))
        # An empty environment: no launch token.
        os.execve(sys.executable, [sys.executable, __file__, "--out", out, "--escaped"], {})
    if os.environ.get("KILL_WAITER"):
        while not os.path.exists(out + ".escaped"):
            time.sleep(0.01)
        os.kill(os.getppid(), 9)  # the waiter
n = 0
while True:
    n += 1
    with open(out, "a") as f:
        f.write(json.dumps({"sample_id": "%d-%d" % (os.getpid(), n), "output_ids": [1],
                            "prompt_tokens": 1, "completion_tokens": 1,
                            "finish_reason": "stop"}) + "\n")
    time.sleep(0.05)
"""


def leaver_config(tmp_path: Path, env: dict[str, str]) -> Path:
    envs = "\n".join(f'{k} = "{v}"' for k, v in env.items())
    return mygen_config(
        tmp_path,
        LEAVER,
        "g",
        "out/g.jsonl",
        f"settle_seconds = 0.5\nstop_grace_seconds = 1.0\n[runs.env]\n{envs}",
    )


def escaped_pid(tmp_path: Path) -> int:
    marker = tmp_path / "work" / "out" / "g.jsonl.escaped"
    wait_until(lambda: marker.exists() and marker.read_text().strip() != "", timeout=30)
    return int(marker.read_text())


async def test_o1_a_member_that_leaves_the_cgroup_and_drops_its_token_is_still_stopped(
    tmp_path: Path, stop_units: list[str]
) -> None:
    """Root may move a process out of the unit's cgroup, and an empty environment drops the
    token: the subreaper waiter's tree still holds it, and the stop is confirmed only once it
    is gone."""
    if not (os.geteuid() == 0 and (CGROUP_MOUNT / "cgroup.procs").exists()):
        pytest.skip("needs root and cgroup v2 mounted at /sys/fs/cgroup/unified")
    from supervisor.config import load_config

    cfg = leaver_config(tmp_path, {"LEAVE_CGROUP": "1"})
    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "g", stop_units)
        assert rv.held_by == "cgroup"
        away = escaped_pid(tmp_path)
        assert token_holders(rv.last_unit.launch_id) != [] and away not in token_holders(
            rv.last_unit.launch_id
        )
        report = await engine.kill("here", rv.process.identity, grace=1.0, run="g")
        assert report.all_gone, report.results
        assert not Path(f"/proc/{away}").exists() or "Z" in Path(f"/proc/{away}/stat").read_text()


async def test_o1_a_member_that_kills_the_waiter_makes_the_stop_unconfirmed(
    tmp_path: Path, stop_units: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a cgroup, a member that kills the waiter and leaves its tree with an empty
    environment can no longer be found: the stop is never reported confirmed."""
    from supervisor.config import load_config

    monkeypatch.setenv("RUNWATCH_AGENT_NO_CGROUP", "1")
    cfg = leaver_config(tmp_path, {"KILL_WAITER": "1"})
    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "g", stop_units)
        away = escaped_pid(tmp_path)
        try:
            lid = rv.last_unit.launch_id
            await asyncio.to_thread(
                wait_until, lambda: not (_unit_record(lid).get("waiter_alive", True)), 10
            )
            now = await snapshot_run(engine, "g")
            if now.process is not None:
                report = await engine.kill("here", now.process.identity, grace=1.0, run="g")
                assert not report.all_gone
                assert "waiter" in (report.unit_detail or ""), report.unit_detail
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(away, 9)


def _unit_record(launch_id: str) -> dict[str, Any]:
    from supervisor.agent import unit

    rec = unit.read_record(launch_id) or {}
    return {"waiter_alive": unit._waiter_alive(rec)} if rec else {}


HOPPER = r"""
import json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = os.path.abspath(os.path.join("out", "B1", "raw_responses.jsonl"))
os.makedirs(os.path.dirname(out), exist_ok=True)
last = 0.0
while True:
    if os.fork():
        os._exit(0)  # a new pid every few milliseconds
    if time.time() - last > 0.5:
        with open(out, "a") as f:
            f.write(json.dumps({"sample_id": str(time.time()), "output_ids": [1],
                                "prompt_tokens": 1, "completion_tokens": 1,
                                "finish_reason": "stop"}) + "\n")
        last = time.time()
    time.sleep(0.002)
"""


async def test_o1_a_run_that_changes_pid_faster_than_a_listing_is_running_and_stoppable(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """A client that forks and exits every few milliseconds: its unit is running (never
    "stopped" or "finished"), a second launch is refused, and the unit's stop is confirmed."""
    from supervisor.config import load_config
    from supervisor.errors import LaunchError

    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(HOPPER)
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    async with Engine(load_config(cfg)) as engine:
        result = await actions.launch(engine, "r")
        assert result.ok, why(result)
        rv = await snapshot_run(engine, "r")
        assert rv.last_unit is not None
        lid = rv.last_unit.launch_id
        stop_units.append(lid)
        assert rv.state == "running", rv.state_text
        try:
            again = await actions.launch(engine, "r")
        except LaunchError as e:
            assert "already running" in str(e)
        else:
            assert not again.ok and "already running" in why(again), why(again)
        stopped = await engine.host("here").request("unit_stop", {"launch_id": lid, "grace": 0.5})
        assert stopped["confirmed"], stopped
        assert token_holders(lid) == []


CRASHING_WORKER = r"""
import os, sys, time
out = os.path.join("out", "B1", "raw_responses.jsonl")
os.makedirs(os.path.dirname(out), exist_ok=True)
if os.fork() == 0:
    with open("worker.pid", "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(0.05)
sys.exit(0)  # the client exits 0 at once; its worker goes on
"""


async def test_o8_a_worker_that_crashes_after_its_client_exited_0_is_a_death(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    from supervisor.config import load_config

    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(CRASHING_WORKER)
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    async with Engine(load_config(cfg)) as engine:
        result = await actions.launch(engine, "r")
        assert result.ok, why(result)
        rv = await snapshot_run(engine, "r")
        lid = rv.last_unit.launch_id
        stop_units.append(lid)
        pidfile = work / "worker.pid"
        await asyncio.to_thread(wait_until, lambda: pidfile.exists() and pidfile.read_text(), 30)
        os.kill(int(pidfile.read_text()), 9)
        await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
        now = await snapshot_run(engine, "r")
        assert now.ending == "died", now.last_unit
        assert "signal 9" in (now.state_detail or ""), now.state_detail


async def test_o2_a_run_of_a_profile_started_by_hand_is_adopted_and_killable(
    tmp_path: Path,
) -> None:
    """A ``[clients.NAME]`` run started by hand is listed as adopted and its kill goes through
    (the kill recognises the profile's scripts, not only the built-in ones)."""
    from supervisor.config import load_config

    cfg = mygen_config(tmp_path, GEN, "mine", "out/x.jsonl")
    work = tmp_path / "work"
    proc = subprocess.Popen(
        [sys.executable, "gen.py", "--out", "out/x.jsonl"], cwd=work, start_new_session=True
    )
    try:
        async with Engine(load_config(cfg)) as engine:
            await asyncio.to_thread(wait_until, lambda: (work / "out" / "x.jsonl").exists(), 30)
            rv = await snapshot_run(engine, "mine")
            assert rv.state == "running" and rv.held_by == "adopted", rv.state_text
            report = await engine.kill("here", rv.process.identity, grace=1.0, run="mine")
            assert report.all_gone, report.results
        assert proc.wait(timeout=10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_o12_a_writer_escaped_from_a_run_killed_outside_blocks_another_config_by_name(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """Config A's client is sent SIGTERM from a terminal (not through runwatch): its handler
    leaves a ``setsid`` writer with no descriptors that keeps appending. Config B, whose run
    writes the same output dir, is refused naming A's config, the writer and A's stop command,
    and nothing of A's is touched; once A's own kill has emptied the unit, B's launch goes
    ahead."""
    from supervisor.config import load_config

    work = tmp_path / "work"
    client(work, "escape")
    cfg_a = write_local_config(tmp_path / "a.toml", run_toml("r", work), python=True)
    cfg_b = write_local_config(tmp_path / "b.toml", run_toml("r", work), python=True)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    async with Engine(load_config(cfg_a)) as ea, Engine(load_config(cfg_b)) as eb:
        rv = await launched(ea, "r", stop_units)
        lid = rv.last_unit.launch_id
        os.kill(rv.process.identity.pid, signal.SIGTERM)
        await asyncio.to_thread(
            wait_until, lambda: rv.process.identity.pid not in token_holders(lid), 10
        )
        escaped = token_holders(lid)
        assert escaped, "the escaped writer is a member of A's unit"
        grown = size(data)
        await asyncio.to_thread(wait_until, lambda: size(data) > grown, 10)
        for action in (actions.launch, actions.restart):
            refused = await action(eb, "r")
            assert not refused.ok
            step = refused.failed_step
            assert step is not None, why(refused)
            assert f"config {cfg_a}'s run 'r'" in step.detail, why(refused)
            assert str(escaped[0]) in step.detail
            assert f"runwatch -c {cfg_a} kill r" in step.detail
        assert token_holders(lid) == escaped  # A's writer got no signal from B
        view = await snapshot_run(ea, "r")
        assert view.state == "running", view.state_text
        assert view.process is not None
        report = await ea.kill("here", view.process.identity, grace=1.0, run="r")
        assert report.all_gone, report.results
        assert token_holders(lid) == []
        ok = await actions.launch(eb, "r")
        assert ok.ok, why(ok)
        stop_units.append((await snapshot_run(eb, "r")).last_unit.launch_id)


async def test_o12_an_adopted_runs_escaped_daemon_keeps_its_restart_from_starting_a_second_writer(
    tmp_path: Path,
) -> None:
    """A run started by hand (no unit, no token) whose double-forked ``setsid`` daemon appends
    and closes per record: its restart stops what it can trace, then sees the data still grow
    and launches nothing (the run stays stopped; no rollback beside the writer)."""
    from supervisor.config import load_config

    work = tmp_path / "work"
    client(work, "daemon")
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "run_inference.py", "--datasets", "B1", "--output-dir", "out"],
        cwd=work,
        start_new_session=True,
    )
    daemon: list[int] = []
    try:
        await asyncio.to_thread(wait_until, lambda: size(data) > 0, 30)
        async with Engine(load_config(cfg)) as engine:
            rv = await snapshot_run(engine, "r")
            # the client and its daemon have one argv: two candidates, named with --pid
            assert rv.state == "ambiguous", rv.state_text
            plan = await engine.plan("r", action="restart", pid=proc.pid)
            result = await engine.execute(plan)
            assert not result.ok
            step = result.failed_step
            assert step is not None and step.name == "quiet", why(result)
            assert "raw_responses.jsonl" in step.detail
            assert proc.wait(timeout=10) is not None  # the traceable part was stopped
            daemon = [
                int(p.name)
                for p in Path("/proc").iterdir()
                if p.name.isdigit() and _cwd(p) == str(work) and int(p.name) != proc.pid
            ]
            assert daemon, "the daemon still writes"
            launch = next(s for s in result.steps if s.name == "launch")
            assert launch.state == "pending" and not result.rollback, why(result)
            now = await snapshot_run(engine, "r")
            assert now.last_unit is None  # nothing was launched: no unit of this run
            # the survivor is shown as the run, never "stopped" while it writes
            assert now.state == "running" and now.process is not None, now.state_text
            assert now.process.identity.pid in daemon
            assert _tags(data) == {"daemon"}  # one writer only: the daemon
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in daemon:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _cwd(p: Path) -> str:
    try:
        return os.readlink(p / "cwd")
    except OSError:
        return ""


def _tags(data: Path) -> set[str]:
    """The writer tags of the records (``daemon``... ``main``: see ``WRITE``)."""
    return {json.loads(line)["sample_id"].split("-")[0] for line in data.read_text().splitlines()}


# Issue 34, "a unit under another name": a run renamed in the config (``a`` -> ``a2``, same argv
# and workdir) whose client closed its inherited descriptors (the run's locks with them) and
# appends only now and then. The unit is recorded with its data files' identities, so a launch of
# any run on those files is refused while it runs, before anything stops, naming the unit and a
# command that stops it; and the agent refuses it again under the locks.
QUIET = r"""
os.closerange(3, 1024)  # the run's locks with the rest
rec = {"sample_id": "q-%d" % os.getpid(), "output_ids": [1, 2], "prompt_tokens": 3,
       "completion_tokens": 2, "finish_reason": "stop"}
with open(OUT, "a") as f:
    f.write(json.dumps(rec) + "\n")
while True:  # the next record in 40 s: no descriptor to find meanwhile
    time.sleep(40)
    with open(OUT, "a") as f:
        f.write(json.dumps(rec) + "\n")
"""


async def test_o26_a_run_renamed_under_its_live_unit_is_refused_naming_the_unit(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    from supervisor.config import load_config

    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + QUIET)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    path = tmp_path / "rw.toml"
    write_local_config(path, run_toml("a", work), python=True)
    async with Engine(load_config(path)) as engine:
        rv = await launched(engine, "a", stop_units)
        lid = rv.last_unit.launch_id
        await asyncio.to_thread(wait_until, lambda: data.exists() and data.stat().st_size, 30)
    before = sha256_of(data)
    members = token_holders(lid)
    assert members

    # The same run under a new name: the config no longer has `a`.
    write_local_config(path, run_toml("a2", work), python=True)
    async with Engine(load_config(path)) as engine:
        result = await launch(engine, "a2")
        assert not result.ok
        text = why(result)
        assert f"unit {lid} of run 'a'" in text and str(data) in text
        assert "nothing was stopped" in text
        assert token_holders(lid) == members and sha256_of(data) == before
        # The command the refusal names stops the unit (the config has no run `a` any more).
        (fix,) = [c for c in text.split("`") if " kill --pid " in c]
        argv = shlex.split(fix)
        assert argv[0] == "runwatch"
        out = subprocess.run(
            [sys.executable, "-m", "supervisor.cli", *argv[1:], "--yes"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        assert token_holders(lid) == []
        again = await launch(engine, "a2")
        assert again.ok, why(again)
        rv2 = await engine.refresh()
        run = next(r for h in rv2.hosts for r in h.runs if r.name == "a2")
        assert run.last_unit is not None
        stop_units.append(run.last_unit.launch_id)


def status_run(config: Path, name: str) -> dict[str, Any]:
    """The run ``name`` as ``runwatch -c CONFIG status --json`` shows it."""
    out = actions.runwatch("-c", str(config), "status", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    snap = json.loads(out.stdout)
    return next(r for h in snap["hosts"] for r in h["runs"] if r["name"] == name)


@pytest.mark.parametrize("name", ["a", "b"])
async def test_o30_another_configs_unit_on_the_runs_files_is_running_there_and_acted_on_only_there(
    tmp_path: Path, held_by: str, stop_units: list[str], name: str
) -> None:
    from supervisor.config import load_config

    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + 'write_forever("main")\n')
    data = work / "out" / "B1" / "raw_responses.jsonl"
    owner = write_local_config(tmp_path / "a.toml", run_toml("a", work), python=True)
    async with Engine(load_config(owner)) as engine:
        rv = await launched(engine, "a", stop_units)
        lid = rv.last_unit.launch_id
        main = rv.process.identity.pid
    await asyncio.to_thread(wait_until, lambda: data.exists() and data.stat().st_size, 30)
    members = token_holders(lid)
    assert members

    # A copy of the config (another key: no `project`), its run under the same name or another,
    # past its dataset's budget under the stop policy.
    body = run_toml(name, work) + 'budget_policy = "stop"\n\n[datasets.B1]\ntoken_budget = 10\n'
    other = write_local_config(tmp_path / "b.toml", body, python=True)
    async with Engine(load_config(other)) as engine:
        assert engine.config.key != load_config(owner).key
        rv = await snapshot_run(engine, name)
        assert rv.state == "running", rv.state_text
        assert rv.owner is not None and rv.owner.launch_id == lid
        assert rv.owner.run == "a" and rv.owner.config_path == str(owner)
        assert rv.process is not None and rv.process.identity.pid == main
        assert f"held by config {owner} run 'a' (pid {main}, unit {lid})" in rv.state_text
        # Its figures, as the owning config sees them.
        deadline = asyncio.get_running_loop().time() + 60
        while not (rv.datasets[0].records and rv.rates.tok_per_s):
            assert asyncio.get_running_loop().time() < deadline, rv.datasets[0]
            await asyncio.sleep(0.2)  # the polling interval of a wait with a deadline
            rv = await snapshot_run(engine, name)
        assert rv.datasets[0].completion_tokens > 10
        # The budget policy is the owning config's: said once, nothing stopped.
        tick = await engine.tick()
        (outcome,) = [o for o in tick.outcomes if o.event.run == name]
        assert not outcome.ok and "only that config acts on it" in outcome.detail
        assert f"runwatch -c {owner} kill a" in outcome.detail
        assert token_holders(lid) == members
        again = await engine.tick()
        assert [o for o in again.outcomes if o.event.run == name] == []

    shown = status_run(other, name)
    assert shown["state"] == "running" and shown["owner"]["launch_id"] == lid
    text = actions.runwatch("-c", str(other), "status")
    assert f"held by config {owner} run 'a'" in text.stdout, text.stdout + text.stderr

    # A kill through this config is refused, naming the command of the owning config.
    refused = actions.runwatch("-c", str(other), "kill", name, "--yes")
    assert refused.returncode != 0 and token_holders(lid) == members
    said = refused.stdout + refused.stderr
    (fix,) = {c for c in said.split("`") if " kill a" in c}
    assert shlex.split(fix) == ["runwatch", "-c", str(owner), "kill", "a"]
    # So is a restart (past the budget check it is forced through), before anything stops.
    async with Engine(load_config(other)) as engine:
        plan = await engine.plan(name, action="restart", force=True)
        assert plan.old is None  # the process is not this run's to stop
        result = await engine.execute(plan)
        step = result.failed_step
        assert step is not None and f"runwatch -c {owner} kill a" in step.detail, why(result)
        assert next(s for s in result.steps if s.name == "stop").state == "pending"
    assert token_holders(lid) == members
    done = actions.runwatch(*shlex.split(fix)[1:], "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert token_holders(lid) == []
    assert status_run(other, name)["state"] == "stopped"


# A hand-started writer that opens, appends and closes once per record (no descriptor to find).
APPEND_EVERY = r"""
import json, os, sys, time
n = 0
while True:
    n += 1
    with open(os.path.join(sys.argv[1], "raw_responses.jsonl"), "a") as f:
        f.write(json.dumps({"sample_id": "hand-%d" % n, "output_ids": [1], "prompt_tokens": 1,
                            "completion_tokens": 1, "finish_reason": "stop"}) + "\n")
    time.sleep(float(sys.argv[2]))
"""


async def test_o31_a_writer_in_a_bind_mounted_workdir_is_the_run_by_file_identity(
    tmp_path: Path, bind_view: Any, spawn: Any
) -> None:
    from supervisor.config import load_config
    from supervisor.errors import LaunchError

    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + 'write_forever("hand")\n')
    data = work / "out" / "B1" / "raw_responses.jsonl"
    view = bind_view(work)
    config = write_local_config(tmp_path / "rw.toml", run_toml("a", work), python=True)
    argv = [sys.executable, "run_inference.py", "--datasets", "B1", "--output-dir", "out"]
    writer = spawn(argv, cwd=view)
    await asyncio.to_thread(wait_until, lambda: data.exists() and data.stat().st_size, 30)
    async with Engine(load_config(config)) as engine:
        rv = await snapshot_run(engine, "a")
        assert rv.state == "running", rv.state_text
        assert rv.process is not None and rv.process.identity.pid == writer.pid
        assert rv.held_by == "adopted" and "by file identity" in rv.state_text
        assert "identity" in rv.process.evidence["a"]
        with pytest.raises(LaunchError) as refused:
            await engine.plan("a", action="launch")
        hint = refused.value.hint or ""
        assert f"pid {writer.pid}" in refused.value.message
        assert f"kill a --pid {writer.pid}`" in hint
    shown = status_run(config, "a")
    assert shown["state"] == "running" and shown["process"]["identity"]["pid"] == writer.pid
    (fix,) = [c for c in hint.split("`") if " --pid " in c]
    done = actions.runwatch(*shlex.split(fix)[1:], "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert writer.wait(30) is not None


async def test_o32_a_writer_working_in_a_bind_mounted_data_directory_blocks_a_launch(
    tmp_path: Path, bind_view: Any, spawn: Any, stop_units: list[str]
) -> None:
    from supervisor.config import load_config

    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(WRITE + 'write_forever("main")\n')
    data = work / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    view = bind_view(data.parent)
    # `python -c`, no configured script, its cwd the data directory seen through the bind mount,
    # appending once a minute: no descriptor, and no growth in a quiet window.
    writer = spawn([sys.executable, "-c", APPEND_EVERY, ".", "60"], cwd=view)
    await asyncio.to_thread(wait_until, lambda: data.exists() and data.stat().st_size, 30)
    before = sha256_of(data)
    config = write_local_config(tmp_path / "rw.toml", run_toml("a", work), python=True)
    async with Engine(load_config(config)) as engine:
        result = await launch(engine, "a")
        if result.identity:  # on a build that misses it: the second writer is stopped here
            rv = await snapshot_run(engine, "a")
            stop_units.append(rv.last_unit.launch_id)
        assert not result.ok, why(result)
        text = why(result)
        assert f"pid {writer.pid}" in text and "by file identity" in text
        assert "nothing was stopped" in text and sha256_of(data) == before
        (fix,) = [c for c in text.split("`") if f" kill a --pid {writer.pid}" in c]
        done = actions.runwatch(*shlex.split(fix)[1:], "--yes")
        assert done.returncode == 0, done.stdout + done.stderr
        assert writer.wait(30) is not None
        again = await launch(engine, "a")
        assert again.ok, why(again)
        rv = await snapshot_run(engine, "a")
        assert rv.last_unit is not None
        stop_units.append(rv.last_unit.launch_id)
