"""A kill that arrives while its target is exiting: the kernel has already released the target's
argv (``/proc/PID/cmdline`` is empty) but the process is not gone. Same pid, start time and owner:
it is the listed run on its way out, so the kill waits for the exit and confirms it; it is never
refused as "argv changed", and never reported gone before it is.

The exiting process is real: a ``run_inference.py`` whose main thread ends with the ``exit``
system call while another thread holds the process open until the test lets it finish. Its
``/proc`` entry then shows what a process shows during its exit: empty argv, state ``Z`` for the
thread-group leader, the same start time.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from supervisor.hosts import Host, process_infos
from supervisor.kill import kill
from supervisor.model import Identity
from tests.fixtures_procs import FakeRun, FakeRuns, alive, argv_of, state_of
from tests.waiting import wait_until

SYS_EXIT = {"x86_64": 60, "aarch64": 93}.get(os.uname().machine)

EXITING_RUN = r"""
import ctypes, json, os, sys, threading
opts = json.loads(os.environ["FAKE_RUN_OPTS"])
go, end = sys.argv[sys.argv.index("--go") + 1], sys.argv[sys.argv.index("--end") + 1]

def hold_open():
    with open(end, "rb") as f:
        f.read(1)
    os._exit(0)

threading.Thread(target=hold_open).start()
tmp = opts["ready"] + ".tmp"
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "children": []}, f)
os.rename(tmp, opts["ready"])
with open(go, "rb") as f:
    f.read(1)
ctypes.CDLL(None).syscall(int(os.environ["SYS_EXIT_NR"]), 0)  # only the main thread ends
"""

pytestmark = pytest.mark.skipif(
    SYS_EXIT is None, reason=f"no exit syscall number known for {os.uname().machine}"
)


def _poke(fifo: Path) -> None:
    with fifo.open("wb") as f:
        f.write(b"x")


async def _exiting_run(
    host: Host, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> tuple[FakeRun, Identity, Path]:
    """A listed run, then made to start exiting; returns (run, listed identity, release fifo)."""
    go, end = fake_runs.dir / "go", fake_runs.dir / "end"
    os.mkfifo(go)
    os.mkfifo(end)
    monkeypatch.setenv("SYS_EXIT_NR", str(SYS_EXIT))
    script = fake_runs.script(body=EXITING_RUN)
    run = fake_runs.start("--go", str(go), "--end", str(end), script=script)
    result = await host.request("ps", {"scripts": ["run_inference.py"]})
    (ident,) = [p.identity for p in process_infos(result) if p.identity.pid == run.pid]
    assert "--go" in ident.argv
    await asyncio.to_thread(_poke, go)
    await asyncio.to_thread(wait_until, lambda: argv_of(run.pid) == [], 15)
    assert alive(run.pid, run.start_time) or state_of(run.pid) == "Z"
    return run, ident, end


async def test_a_kill_waits_for_an_exiting_run_and_confirms_its_exit(
    host: Host, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, ident, end = await _exiting_run(host, fake_runs, monkeypatch)
    task = asyncio.ensure_future(kill(host, ident, grace=30.0))
    await asyncio.to_thread(_poke, end)  # the process finishes its exit
    report = await asyncio.wait_for(task, 60)
    (res,) = report.results
    assert res.pid == run.pid and res.outcome == "already-gone", res
    assert res.confirmed and report.all_gone and not report.refused
    assert res.signals == []
    assert run.popen.poll() == 0  # it had really exited when the kill said so


async def test_an_exiting_run_that_does_not_finish_is_not_reported_gone(
    host: Host, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, ident, end = await _exiting_run(host, fake_runs, monkeypatch)
    try:
        report = await kill(host, ident, grace=0.3)
        (res,) = report.results
        # Not gone: never "already-gone"; not "argv changed" either: it is the listed process.
        assert not res.confirmed and not report.all_gone, res
        assert "argv changed" not in res.detail and "exiting" in res.detail
        assert res.signals == []
        assert run.popen.poll() is None  # and indeed it is still there
    finally:
        await asyncio.to_thread(_poke, end)
