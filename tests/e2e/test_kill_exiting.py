"""Invariant 8: a process whose main thread has exited while other threads run is still a process:
listed, matched through its live threads (its argv and state are read from them), and killable;
never refused as "argv changed", never reported gone before it is.

The process is real: a ``run_inference.py`` whose main thread ends with the ``exit`` system call
while another thread keeps running (until the test lets it finish, or for ever). Its ``/proc``
entry then shows an empty ``cmdline`` and state ``Z`` for the thread-group leader, the same start
time, and live tasks in ``/proc/PID/task``.
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

if os.environ.get("IGNORE_TERM") == "1":
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


async def test_inv8_a_process_whose_main_thread_exited_is_listed_matched_and_killed(
    host: Host, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, ident, end = await _exiting_run(host, fake_runs, monkeypatch)
    try:
        result = await host.request("ps", {"scripts": ["run_inference.py"]})
        (listed,) = [p for p in process_infos(result) if p.identity.pid == run.pid]
        assert listed.identity == ident  # the same identity, argv read from a live thread
        assert listed.state in ("S", "R"), listed.state  # a live thread's state, never "Z"
        report = await kill(host, ident, grace=30.0)
        (res,) = report.results
        assert res.pid == run.pid and res.outcome == "terminated", res
        assert res.signals == ["SIGTERM"] and res.confirmed and report.all_gone
        assert run.popen.wait(timeout=10) == -15
    finally:
        if run.popen.poll() is None:
            await asyncio.to_thread(_poke, end)


async def test_inv8_a_main_thread_exited_process_ignoring_sigterm_is_killed(
    host: Host, fake_runs: FakeRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IGNORE_TERM", "1")
    run, ident, end = await _exiting_run(host, fake_runs, monkeypatch)
    try:
        report = await kill(host, ident, grace=0.3)
        (res,) = report.results
        assert "argv changed" not in res.detail
        assert res.outcome == "killed" and res.signals == ["SIGTERM", "SIGKILL"], res
        assert res.confirmed and report.all_gone
        assert run.popen.wait(timeout=10) == -9
    finally:
        if run.popen.poll() is None:
            await asyncio.to_thread(_poke, end)
