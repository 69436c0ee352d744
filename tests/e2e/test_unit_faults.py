"""Faults of a unit's own bookkeeping (O13, O14): its record cannot be written (a full disk),
is edited or removed under the live run, or its waiter answers the launch too late.

The record is bookkeeping; the waiter's hold on the run's tree is not. A start whose record
cannot be written is refused before anything runs, a waiter whose record stops being writable
while its run goes on keeps reaping, holding and recording (once space is back), and a launch
reported failed leaves nothing of it running. Real processes, the real agent, real tmpfs
mounts, a real cgroup v2 leaf (as root) and the launch-token path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.engine import Engine
from tests import fixtures_actions as actions
from tests.e2e import test_units
from tests.e2e.test_units import _ended, launched, run_toml, snapshot_run, token_holders
from tests.fixtures_actions import why
from tests.fixtures_config import write_local_config
from tests.waiting import wait_until

# A client that writes a record and forks a short-lived child every 0.1 s: its tree changes
# all the time, so its waiter rewrites the unit's record (the members it tracks) every second.
FORKER = r"""
import json, os, time
OUT = os.path.join("out", "B1", "raw_responses.jsonl")
os.makedirs(os.path.dirname(OUT), exist_ok=True)
n = 0
while True:
    n += 1
    child = os.fork()
    if child == 0:
        time.sleep(0.05)
        os._exit(0)
    with open(OUT, "a") as f:
        f.write(json.dumps({"sample_id": "%d-%d" % (os.getpid(), n), "output_ids": [1],
                            "prompt_tokens": 1, "completion_tokens": 1,
                            "finish_reason": "stop"}) + "\n")
    with open("forks.tmp", "w") as f:
        f.write(str(n))
    os.replace("forks.tmp", "forks")
    time.sleep(0.1)
    os.waitpid(child, 0)
"""


held_by = test_units.held_by
"""Each test twice: in a cgroup v2 leaf and on the launch-token path."""
stop_units = test_units.stop_units
"""Launch ids whose token holders are killed at teardown."""


@pytest.fixture
def units_fs() -> Iterator[Path]:
    """A 256 KiB tmpfs mounted over the host's unit records (``<state>/runwatch/units``)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    units = Path(os.environ["XDG_STATE_HOME"]) / "runwatch" / "units"
    units.mkdir(parents=True, exist_ok=True, mode=0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(units)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield units
    finally:
        subprocess.run(["umount", "-l", str(units)], capture_output=True, check=False)


def fill(folder: Path) -> Path:
    """Fill ``folder``'s filesystem to the last byte; returns the filler (remove it to free)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def _record(units: Path, launch_id: str) -> dict[str, Any]:
    try:
        value = json.loads((units / f"{launch_id}.json").read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in "ZX"


def _forks(work: Path) -> int:
    try:
        return int((work / "forks").read_text() or 0)
    except (OSError, ValueError):
        return 0


def _every_token_holder(within: Path) -> list[int]:
    """Every live process that carries a launch token and runs in ``within`` (the test's own:
    other runs of this machine are never counted)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if b"RUNWATCH_LAUNCH=" in Path(f"/proc/{entry}/environ").read_bytes() and Path(
                    os.readlink(f"/proc/{entry}/cwd")
                ).is_relative_to(within):
                    found.append(int(entry))
    return [p for p in found if _alive(p)]


async def test_o13_a_start_whose_unit_record_cannot_be_written_is_refused_and_nothing_runs(
    tmp_path: Path, held_by: str, units_fs: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(FORKER)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    fill(units_fs)
    try:
        async with Engine(load_config(cfg)) as engine:
            result = await actions.launch(engine, "r")
            started = _every_token_holder(work)
            assert not result.ok, why(result)
            # Refused before the client ran: nothing carries a token of it, nothing was written.
            assert started == [], started
            assert not data.exists()
            assert "record" in why(result) and "No space left" in why(result), why(result)
            rv = await snapshot_run(engine, "r")
            assert rv.state == "stopped", rv.state_text
    finally:
        for pid in _every_token_holder(work):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


async def test_o13_a_waiter_whose_record_fills_the_disk_keeps_holding_and_records_later(
    tmp_path: Path, held_by: str, units_fs: Path, stop_units: list[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(FORKER)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        lid = rv.last_unit.launch_id
        waiter = int(_record(units_fs, lid)["waiter"]["pid"])
        filler = fill(units_fs)
        # Its tree changed many times since the disk filled: the waiter tried to record it.
        forks = _forks(work)
        await asyncio.to_thread(wait_until, lambda: _forks(work) >= forks + 30, 30)
        assert _alive(waiter), "the unit's waiter died when its record could not be written"
        now = await snapshot_run(engine, "r")
        assert now.state == "running", now.state_text
        assert now.process is not None
        report = await engine.kill("here", now.process.identity, grace=1.0, run="r")
        assert report.all_gone, (report.unit_detail, report.results)
        assert token_holders(lid) == []
        size = data.stat().st_size
        # Space is back: the waiter records how the run ended and ends; the run was stopped.
        filler.unlink()
        await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
        await asyncio.to_thread(wait_until, lambda: not _alive(waiter), 30)
        record = _record(units_fs, lid)
        assert record.get("exit") is not None, record
        assert data.stat().st_size == size
        ended = await snapshot_run(engine, "r")
        assert ended.state == "stopped" and ended.ending == "stopped", ended.last_unit
        if held_by == "cgroup":
            assert not (Path("/sys/fs/cgroup/unified/runwatch") / lid).exists()


# A client whose first act fills its output's filesystem (a disk left nearly full): it keeps
# running, retrying its writes, as a real client waiting for space does.
FILLER = r"""
import os, time
os.makedirs(os.path.join("out", "B1"), exist_ok=True)
fd = os.open(os.path.join("out", "B1", "cache.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
for size in (65536, 4096, 1):
    try:
        while True:
            os.write(fd, b"\0" * size)
    except OSError:
        pass
with open("full", "w") as f:
    f.write(str(os.getpid()))
while True:
    try:
        with open(os.path.join("out", "B1", "raw_responses.jsonl"), "a") as f:
            f.write("{}\n")
    except OSError:
        pass
    time.sleep(0.05)
"""


@pytest.fixture
def out_fs(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs mounted as the run's output dir (``<tmp>/work/out``)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    out = tmp_path / "work" / "out"
    out.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k,mode=0755", "tmpfs", str(out)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield out
    finally:
        subprocess.run(["umount", "-l", str(out)], capture_output=True, check=False)


async def test_o13_a_client_that_fills_its_disk_at_once_is_a_started_run_never_a_failed_launch(
    tmp_path: Path, held_by: str, out_fs: Path, stop_units: list[str]
) -> None:
    """The launch's own records after the start (the lock's holder, the launch fingerprint)
    cannot be written: the client runs, so the launch is a start, with a warning naming what
    was not recorded, never a failure that a retry or a rollback would act on."""
    work = tmp_path / "work"
    (work / "run_inference.py").write_text(FILLER)
    body = run_toml("r", work).replace("settle_seconds = 0.5", "settle_seconds = 2.0")
    cfg = write_local_config(tmp_path / "rw.toml", body, python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        result = await actions.launch(engine, "r")
        rv = await snapshot_run(engine, "r")
        if rv.last_unit is not None:
            stop_units.append(rv.last_unit.launch_id)
        assert (work / "full").exists(), why(result)  # the client did fill its disk
        assert result.ok, why(result)
        assert "No space left" in why(result), why(result)
        assert rv.state == "running", rv.state_text
        assert rv.process is not None
        report = await engine.kill("here", rv.process.identity, grace=1.0, run="r")
        assert report.all_gone, (report.unit_detail, report.results)


async def test_o13_a_run_whose_unit_records_were_removed_is_still_held_by_its_token(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """A unit's record edited on disk, then ``rm -rf`` of the host's state dir under the live
    run (a user resetting runwatch): the waiter, its record's keeper, writes it again, so the
    run is its unit still: running, a second launch refused, and its double-forked ``setsid``
    daemon that opens, appends and closes per record stopped with it, the kill confirmed only
    once nothing of the unit is left."""
    import shutil

    from supervisor.errors import LaunchError
    from tests.e2e.test_units import client

    work = tmp_path / "work"
    client(work, "daemon")
    data = work / "out" / "B1" / "raw_responses.jsonl"
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        lid = rv.last_unit.launch_id
        await asyncio.to_thread(wait_until, lambda: len(token_holders(lid)) >= 2, 30)
        await asyncio.to_thread(wait_until, lambda: data.exists() and data.stat().st_size > 0, 30)
        record = Path(os.environ["XDG_STATE_HOME"]) / "runwatch" / "units" / f"{lid}.json"
        whole = json.loads(record.read_text())
        # Edited on disk (a torn or hand-edited record that says the unit ended), then the
        # whole state dir removed: the waiter writes its record again, whole, within a tick.
        record.write_text(json.dumps({"state": "ended", "launch_id": lid})[:-1])

        def whole_again() -> bool:
            now = _record(record.parent, lid)
            return all(now.get(k) == whole[k] for k in ("token", "child", "waiter", "cgroup")) and (
                now.get("state") == "running"
            )

        await asyncio.to_thread(wait_until, whole_again, 30)
        shutil.rmtree(Path(os.environ["XDG_STATE_HOME"]) / "runwatch")
        await asyncio.to_thread(wait_until, whole_again, 30)
        assert (record.parent.stat().st_mode & 0o777) == 0o700
        now = await snapshot_run(engine, "r")
        assert now.state == "running", now.state_text
        assert now.last_unit is not None and now.last_unit.launch_id == lid
        try:
            again = await actions.launch(engine, "r")
        except LaunchError as e:
            assert "already running" in str(e), str(e)
        else:
            assert not again.ok and "already running" in why(again), why(again)
        assert now.process is not None
        report = await engine.kill("here", now.process.identity, grace=1.0, run="r")
        assert report.all_gone, (report.unit_detail, report.results)
        assert token_holders(lid) == []  # the daemon too: nothing of the unit is left


def _waiters() -> list[int]:
    """The pids of every live launch waiter of this test's agents (``runwatch-waiter`` in its
    argv, this test's state dir in its environment)."""
    mine = f"XDG_STATE_HOME={os.environ['XDG_STATE_HOME']}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if b"runwatch-waiter" in Path(f"/proc/{entry}/cmdline").read_bytes() and (
                    mine in Path(f"/proc/{entry}/environ").read_bytes()
                ):
                    found.append(int(entry))
    return [p for p in found if _alive(p)]


async def test_o14_a_launch_whose_waiter_answers_too_late_leaves_nothing_running(
    tmp_path: Path, held_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent waits for the waiter's answer a bounded time (10 s; here 1 ms, as a host too
    loaded to start Python in 10 s would be): the launch is reported failed, so nothing of it
    may run, or a retry or rollback would start a second writer beside it."""
    monkeypatch.setenv("RUNWATCH_AGENT_ANSWER_S", "0.001")
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(FORKER)
    data = work / "out" / "B1" / "raw_responses.jsonl"
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    try:
        async with Engine(load_config(cfg)) as engine:
            result = await actions.launch(engine, "r")
            assert not result.ok, why(result)
            assert "did not answer" in why(result), why(result)
            # The waiter gives up by itself; once it is gone nothing of the launch ran.
            await asyncio.to_thread(wait_until, lambda: not _waiters(), 30)
            assert _every_token_holder(work) == []
            assert not data.exists()
            rv = await snapshot_run(engine, "r")
            assert rv.state == "stopped", rv.state_text
    finally:
        for pid in _every_token_holder(work):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


# A client that signals its parent as some launchers expect ("ready": SIGUSR1; "a worker
# failed, stop": SIGTERM; SIGUSR2, SIGALRM, SIGQUIT), notes the dispositions it was started
# with, then crashes (exit 3) once told to.
PARENT_SIGNALLER = r"""
import json, os, signal, sys, time
def how(h):
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored"}.get(h, "handled")
with open("dispositions.json", "w") as f:
    json.dump({name: how(signal.getsignal(getattr(signal, name))) for name in
               ("SIGINT", "SIGHUP", "SIGTERM", "SIGUSR1", "SIGPIPE", "SIGQUIT")}, f)
for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR2, signal.SIGALRM, signal.SIGQUIT):
    os.kill(os.getppid(), sig)
with open("signalled", "w") as f:
    f.write(str(os.getppid()))
while not os.path.exists("go"):
    time.sleep(0.02)
sys.exit(3)
"""


async def test_o15_a_client_that_signals_its_parent_neither_ends_its_waiter_nor_fakes_a_stop(
    tmp_path: Path, held_by: str, stop_units: list[str]
) -> None:
    """The waiter is the client's parent: a client that signals its parent (readiness, "stop
    the launcher") must not end it (its exit would go unrecorded, its tree unheld) nor make its
    later crash read as a stop through runwatch; and the client starts with the signal
    dispositions it would have if started by hand (nothing ignored it did not ignore)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "run_inference.py").write_text(PARENT_SIGNALLER)
    cfg = write_local_config(tmp_path / "rw.toml", run_toml("r", work), python=True)
    from supervisor.config import load_config

    async with Engine(load_config(cfg)) as engine:
        rv = await launched(engine, "r", stop_units)
        lid = rv.last_unit.launch_id
        await asyncio.to_thread(wait_until, lambda: (work / "signalled").exists(), 30)
        waiter = int((work / "signalled").read_text())
        assert waiter == int(_record(_units(), lid)["waiter"]["pid"])
        seen = json.loads((work / "dispositions.json").read_text())
        # As when started by hand: Python's own SIGINT handler (it installs none when SIGINT
        # comes ignored) and its SIGPIPE ignored; every other one at its default.
        assert seen == {
            "SIGINT": "handled",
            "SIGHUP": "default",
            "SIGTERM": "default",
            "SIGUSR1": "default",
            "SIGPIPE": "ignored",
            "SIGQUIT": "default",
        }, seen
        now = await snapshot_run(engine, "r")
        assert now.state == "running", now.state_text
        assert _alive(waiter), "a signal from its client ended the unit's waiter"
        (work / "go").write_text("")
        await asyncio.to_thread(wait_until, lambda: _ended(lid), 30)
        ended = await snapshot_run(engine, "r")
        assert ended.ending == "died", ended.last_unit
        assert ended.last_unit is not None and ended.last_unit.exit is not None
        assert ended.last_unit.exit.code == 3, ended.last_unit


def _units() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "runwatch" / "units"
