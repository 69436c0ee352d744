"""Real processes for the process-listing and kill tests, and the ``host`` they run on.

Fixtures:
- ``host``: a connected ``LocalHost`` (the real agent as a subprocess). Tests written against it use
  only the ``supervisor.hosts.Host`` interface, so a module may override ``host`` (e.g. with an
  SSH host) and re-run them.
- ``fake_runs``: starts real processes literally named ``run_inference.py`` (optionally ignoring
  SIGTERM, with worker children, under a parent that never reaps, as another user) and decoys;
  everything is killed at teardown.

Helpers: ``gone(pid, start_time)``, ``start_time_of(pid)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import HostConfig
from supervisor.hosts import LocalHost
from tests.waiting import wait_until

NOBODY_UID = 65534

# The stand-in for a data-generation run. Options arrive in the environment so that argv stays
# exactly what the test chose. It writes READY (JSON: pid, children) once its signal handlers and
# workers are in place, and a ``.term`` file each time SIGTERM arrives while it ignores it.
FAKE_RUN = r"""
import json, os, signal, subprocess, sys
opts = json.loads(os.environ["FAKE_RUN_OPTS"])
ready = opts["ready"]

def note_term(*_):
    with open(ready + ".term", "a") as f:
        f.write("%d\n" % os.getpid())

if opts.get("ignore_term"):
    signal.signal(signal.SIGTERM, note_term)
signal.signal(signal.SIGUSR1, lambda *_: os._exit(7))
children = []
for i in range(opts.get("children", 0)):
    if opts.get("fork"):
        pid = os.fork()
        if pid == 0:
            while True:
                signal.pause()
        children.append(pid)
    else:
        ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        code = (
            "import signal, sys\n"
            + (ignore if opts.get("child_ignore_term") else "")
            + "print('up', flush=True)\n"
            + "while True: signal.pause()\n"
        )
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        p.stdout.readline()  # the worker's handlers are installed
        children.append(p.pid)
tmp = ready + ".tmp"
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "children": children}, f)
os.rename(tmp, ready)
while True:
    signal.pause()
"""

# A parent that starts the run and never reaps it: the run becomes a zombie when it exits.
NEVER_REAPS = r"""
import signal, subprocess, sys
subprocess.Popen(sys.argv[1:])
while True:
    signal.pause()
"""


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[19])


def state_of(pid: int) -> str | None:
    """The kernel state letter of ``pid`` (``Z`` for a zombie), None when there is no such pid."""
    st = _stat(pid)
    return st[0] if st else None


def argv_of(pid: int) -> list[str]:
    return _argv(pid)


def start_time_of(pid: int) -> int | None:
    st = _stat(pid)
    return st[1] if st else None


def gone(pid: int, start_time: int | None = None) -> bool:
    """True when the process has exited (no such pid, pid reused, or a zombie)."""
    st = _stat(pid)
    if st is None:
        return True
    if start_time is not None and st[1] != start_time:
        return True
    return st[0] in ("Z", "X")


def alive(pid: int, start_time: int | None = None) -> bool:
    return not gone(pid, start_time)


@dataclass
class FakeRun:
    """A started process: ``pid`` is the run itself (not a wrapper), ``children`` its workers."""

    pid: int
    start_time: int
    children: list[int]
    ready: Path
    popen: subprocess.Popen[bytes]
    argv: list[str] = field(default_factory=list)

    def term_count(self) -> int:
        """How many SIGTERMs the run (ignoring them) has received so far."""
        path = Path(str(self.ready) + ".term")
        return len(path.read_text().split()) if path.exists() else 0


class FakeRuns:
    """Starts real processes for a test and kills every one of them at teardown."""

    def __init__(self) -> None:
        # World-readable and writable so that a process of another user can run from it too.
        self.dir = Path(tempfile.mkdtemp(prefix="runwatch-procs-", dir=shared_temp_base()))
        self.dir.chmod(0o777)
        self._n = 0
        self._popens: list[subprocess.Popen[bytes]] = []
        self._pids: list[tuple[int, int]] = []

    def script(self, name: str = "run_inference.py", body: str = FAKE_RUN) -> Path:
        sub = self.dir / f"s{self._n}"
        self._n += 1
        sub.mkdir(mode=0o755)
        sub.chmod(0o755)
        path = sub / name
        path.write_text(body)
        path.chmod(0o644)
        return path

    def start(
        self,
        *args: str,
        ignore_term: bool = False,
        children: int = 0,
        child_ignore_term: bool = False,
        fork: bool = False,
        never_reaped: bool = False,
        cwd: str | Path | None = None,
        python: str = sys.executable,
        prefix: Sequence[str] = (),
        script: Path | None = None,
        timeout: float = 20.0,
    ) -> FakeRun:
        """Start ``python run_inference.py *args`` and wait until it is ready.

        ``prefix`` goes before the interpreter (``setpriv ...`` to run as another user).
        ``never_reaped`` starts it under a parent that never waits for it.
        """
        path = script or self.script()
        ready = self.dir / f"ready{self._n}.json"
        self._n += 1
        opts = {
            "ready": str(ready),
            "ignore_term": ignore_term,
            "children": children,
            "child_ignore_term": child_ignore_term,
            "fork": fork,
        }
        argv = [python, str(path), *args]
        cmd = [*prefix, *argv]
        if never_reaped:
            parent = self.script("never_reaps.py", NEVER_REAPS)
            cmd = [*prefix, python, str(parent), *argv]
        env = {**os.environ, "FAKE_RUN_OPTS": json.dumps(opts)}
        popen = subprocess.Popen(cmd, cwd=cwd or path.parent, env=env, stdin=subprocess.DEVNULL)
        self._track(popen)
        wait_until(lambda: ready.exists() or popen.poll() is not None, timeout)
        assert ready.exists(), f"fake run exited early with {popen.returncode}"
        info = json.loads(ready.read_text())
        pid = int(info["pid"])
        start = start_time_of(pid)
        assert start is not None
        self._pids.append((pid, start))
        kids = [int(c) for c in info["children"]]
        for k in kids:
            ks = start_time_of(k)
            if ks is not None:
                self._pids.append((k, ks))
        return FakeRun(pid, start, kids, ready, popen, argv)

    def decoy(
        self, argv: Sequence[str], expect: Sequence[str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a process that is not a run (its argv mentions one); its stdin stays open.

        Waits until the process shows ``expect`` (default ``argv``) as its argv in /proc.
        """
        popen = subprocess.Popen(
            list(argv),
            cwd=self.dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._track(popen)
        want = list(expect if expect is not None else argv)
        wait_until(lambda: _argv(popen.pid) == want or popen.poll() is not None, timeout=15)
        assert popen.poll() is None, f"decoy {argv} exited with {popen.returncode}"
        return popen

    def _track(self, popen: subprocess.Popen[bytes]) -> None:
        self._popens.append(popen)
        st = start_time_of(popen.pid)
        if st is not None:
            self._pids.append((popen.pid, st))

    def cleanup(self) -> None:
        for pid, start in self._pids:
            if alive(pid, start):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        for p in self._popens:
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def shared_temp_base() -> Path:
    """A temporary directory every user can reach: ``TMPDIR`` when each directory on its way lets
    others through, else the first system one that does (``TMPDIR`` inside a 0700 home is common,
    and a process of another user could not open anything under it)."""
    for cand in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"):
        path = Path(cand).resolve()
        if path.is_dir() and all(os.stat(p).st_mode & stat.S_IXOTH for p in (path, *path.parents)):
            return path
    raise RuntimeError("no temporary directory that every user can reach; set TMPDIR to one")


def _argv(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode() for a in raw.split(b"\0")[:-1]]


def as_nobody() -> list[str] | None:
    """A command prefix that runs as user ``nobody`` (None when that is impossible here)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    return [setpriv, f"--reuid={NOBODY_UID}", f"--regid={NOBODY_UID}", "--clear-groups"]


def system_python() -> str | None:
    """A Python that user ``nobody`` can execute (the venv may live under /root)."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand):
            return cand
    return None


@pytest.fixture
def fake_runs() -> Iterator[FakeRuns]:
    runs = FakeRuns()
    try:
        yield runs
    finally:
        runs.cleanup()


def local_host_config(**kw: Any) -> HostConfig:
    return HostConfig(name=kw.pop("name", "local"), local=True, **kw)


@pytest.fixture
async def host() -> AsyncIterator[LocalHost]:
    """A connected LocalHost running the real agent."""
    h = LocalHost(local_host_config(command_timeout=30.0))
    await h.connect()
    try:
        yield h
    finally:
        await h.close()


def runs_by_pid(result: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """The processes of a ``ps``/``refresh`` reply by pid."""
    return {p["identity"]["pid"]: p for p in result["processes"]}


def interrupted(proc: subprocess.Popen[bytes], timeout: float = 30) -> tuple[bytes, bytes]:
    """Ctrl-C (SIGINT) to ``proc`` and its output once it ended. A process still there after
    ``timeout`` fails the test with what tells why: its signal masks (blocked, ignored, caught)
    and every thread's stack (SIGABRT; a child started with ``PYTHONFAULTHANDLER=1`` prints it)."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                masks = "".join(line for line in f if line.startswith(("Sig", "Shd", "State")))
        except OSError as e:
            masks = f"(no /proc status: {e})"
        proc.send_signal(signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        text = err.decode(errors="replace")[-6000:]
        raise AssertionError(
            f"pid {proc.pid} still there {timeout:g} s after SIGINT\n{masks}\n{text}"
        ) from None
