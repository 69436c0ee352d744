"""Children started for a query (``nvidia-smi``, ``squeue``, ``sacct``...) under one deadline for
the whole run and one cap on the bytes read.

Standard library only, Python >= 3.8 (runs on the host inside the agent). The child runs in a
process group of its own; at the deadline, or when its output passes the cap, the whole group is
SIGKILLed and the child reaped, so a hung tool (or a grandchild of a wrapper script holding its
pipe) leaves nothing behind and never delays the reply past the deadline.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time


class Finished:
    """What a bounded child did: its output (cut at the cap), its exit status (None when it
    was killed), and ``problem``: why it was killed (``no answer within 5 s``, ``output over
    1 MiB``)."""

    def __init__(
        self, stdout: bytes, stderr: bytes, returncode: int | None, problem: str | None
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.returncode = returncode
        self.problem = problem

    @property
    def timed_out(self) -> bool:
        return self.problem is not None and self.problem.startswith("no answer")


_live: set[subprocess.Popen[bytes]] = set()
"""The bounded children running now (killed by :func:`kill_all` when the agent exits)."""
_live_lock = threading.Lock()


def kill_all() -> None:
    """SIGKILL the process group of every bounded child still running: an agent that exits
    (its channel closed) leaves no query behind."""
    with _live_lock:  # held: a child listed here is not reaped yet, its group id is its own
        for proc in _live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def _exited(pid: int, deadline: float) -> bool:
    """Wait until child ``pid`` exits or ``deadline`` passes, without reaping it: while it is
    not reaped its pid (and so its process group's id) cannot be reused."""
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's process group (the child leads it and is not reaped yet, so the
    group's id is still its own), then reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run(
    argv: list[str],
    deadline_s: float,
    max_bytes: int,
    env: dict[str, str] | None = None,
) -> Finished:
    """Run ``argv`` (stdin closed) until it exits and closes its output, at most ``deadline_s``
    seconds in all and ``max_bytes`` of stdout; OSError when it cannot be started."""
    deadline = time.monotonic() + deadline_s
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    with _live_lock:
        _live.add(proc)
    out: list[bytes] = []
    err: list[bytes] = []
    got = 0
    problem: str | None = None
    assert proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    try:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                problem = f"no answer within {deadline_s:g} s"
                break
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.append(chunk)
                if key.data is out:
                    got += len(chunk)
            if got > max_bytes:
                problem = f"output over {_size(max_bytes)}"
                break
        if problem is None and not _exited(proc.pid, deadline):
            problem = f"no answer within {deadline_s:g} s"
    finally:
        sel.close()
        # The group goes whatever happened: a wrapper's children must not outlive the query.
        with _live_lock:
            _live.discard(proc)
        kill_group(proc)
        proc.stdout.close()
        proc.stderr.close()
    stdout = b"".join(out)[:max_bytes]
    return Finished(stdout, b"".join(err)[-65536:], None if problem else proc.returncode, problem)
