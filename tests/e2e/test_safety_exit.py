"""Invariant 8: "exit confirmed" means nothing of the run is left. After the grace period and again
before confirming, the kill looks for what the tree it saw at the start no longer shows: a process
forked by a SIGTERM handler that then exits, a child that called ``setsid`` and left the group and
the tree, anything still holding the run's data files for writing or its lock; it stops and
confirms them too. Real processes, the real agent."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.hosts import Host, process_infos
from supervisor.kill import kill
from supervisor.model import Identity
from tests.fixtures_procs import FakeRuns, alive, gone
from tests.waiting import wait_until

# A run that holds its data file open for appending. On SIGTERM it forks a child that calls
# setsid (leaving the session, the group and, once its parent exits, the tree), ignores SIGTERM
# and keeps the data file; with EXEC_AWAY the child also execs another program (another argv).
# The parent then exits at once. PIDs of forks are appended to READY.forks.
FORKS_ON_TERM = r"""
import json, os, signal, sys
opts = json.loads(os.environ["FAKE_RUN_OPTS"])
data = open(os.environ["DATA_PATH"], "a")
ready = opts["ready"]

AWAY = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: signal.pause()"


def on_term(*_):
    pid = os.fork()
    if pid == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(ready + ".forks", "a") as f:
            f.write("%d\n" % os.getpid())
        if os.environ.get("EXEC_AWAY") == "1":  # another program, still writing the run's file
            os.set_inheritable(data.fileno(), True)
            os.execv(sys.executable, [sys.executable, "-c", AWAY])
        while True:
            signal.pause()
    os._exit(0)

signal.signal(signal.SIGTERM, on_term)
tmp = ready + ".tmp"
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "children": []}, f)
os.rename(tmp, ready)
while True:
    signal.pause()
"""

# A run that has already daemonized a worker (double fork + setsid) before any kill: the worker
# is in neither its tree nor its session, and writes the run's data file.
DAEMONIZED_WORKER = r"""
import json, os, signal, sys
opts = json.loads(os.environ["FAKE_RUN_OPTS"])
ready = opts["ready"]
WORKER = (
    "import os, signal\nos.write(%d, str(os.getpid()).encode())\nos.close(%d)\n"
    "while True: signal.pause()"
)
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        data = open(os.environ["DATA_PATH"], "a")
        os.set_inheritable(data.fileno(), True)
        os.set_inheritable(w, True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # kept across exec
        os.execv(sys.executable, [sys.executable, "-c", WORKER % (w, w)])
    os._exit(0)
os.close(w)
worker = int(os.read(r, 32))
tmp = ready + ".tmp"
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "children": [worker]}, f)
os.rename(tmp, ready)
while True:
    signal.pause()
"""


def _forks(ready: Path) -> list[int]:
    path = Path(str(ready) + ".forks")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


async def _identity(host: Host, pid: int) -> Identity:
    result = await host.request("ps", {"scripts": ["run_inference.py"]})
    (ident,) = [p.identity for p in process_infos(result) if p.identity.pid == pid]
    return ident


@pytest.mark.parametrize("exec_away", [False, True], ids=["same-argv", "exec-other-argv"])
async def test_inv8_a_sigterm_handler_that_forks_then_exits_leaves_nothing(
    host: Host,
    fake_runs: FakeRuns,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    exec_away: bool,
) -> None:
    data = tmp_path / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    monkeypatch.setenv("DATA_PATH", str(data))
    monkeypatch.setenv("EXEC_AWAY", "1" if exec_away else "0")
    run = fake_runs.start("--datasets", "B1", script=fake_runs.script(body=FORKS_ON_TERM))
    ident = await _identity(host, run.pid)
    report = await kill(host, ident, grace=1.0, files=[str(data)])
    forks = _forks(run.ready)
    assert len(forks) == 1, forks
    by_pid = {r.pid: r for r in report.results}
    assert forks[0] in by_pid, report.results  # found, stopped and confirmed
    assert by_pid[forks[0]].confirmed and by_pid[run.pid].confirmed
    assert report.all_gone, report.results
    assert gone(forks[0])
    assert gone(run.pid, run.start_time)


async def test_inv8_a_daemonized_writer_of_the_run_files_is_stopped_and_confirmed(
    host: Host, fake_runs: FakeRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "out" / "B1" / "raw_responses.jsonl"
    data.parent.mkdir(parents=True)
    monkeypatch.setenv("DATA_PATH", str(data))
    run = fake_runs.start("--datasets", "B1", script=fake_runs.script(body=DAEMONIZED_WORKER))
    (worker,) = run.children  # killed at teardown whatever happens (fake_runs tracks it)
    assert alive(worker)
    ident = await _identity(host, run.pid)
    report = await kill(host, ident, grace=0.5, files=[str(data)])
    by_pid = {r.pid: r for r in report.results}
    assert by_pid[worker].role == "holder" and by_pid[worker].outcome == "killed", report.results
    assert report.all_gone
    wait_until(lambda: gone(worker), 10)
