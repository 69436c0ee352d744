"""Python code run as ``python -c code`` runs it, in a fresh interpreter, without starting one
Python per call: the checks of what importing a module imports, and the command line in a process
of its own, start hundreds of interpreters otherwise.

One server per test process: ``python -c SERVER``, which imports nothing (it uses only ``sys``
and ``os``, which every interpreter has loaded before it runs ``-c``), and forks a child for each
call. The child is that fresh interpreter: its ``__main__`` holds only what a fresh one's does,
its ``sys.modules`` is the server's untouched start-up set (checked against a real fresh
interpreter when the server starts), it takes the caller's environment and working directory,
reads ``/dev/null``, writes its own stdout and stderr, and runs ``code`` as the last statement of
its ``__main__``: an exception, ``sys.exit``, ``atexit`` and the wait for threads are the
interpreter's own. Nothing one call imports is seen by the next. A call whose ``PYTHON*``
environment (read at interpreter start-up) differs from the server's starts a real interpreter.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping

SERVER = r"""import os, sys
def _serve():
    read, write, fork = os.read, os.write, os.fork
    buffered = b""
    while True:
        while b"\n" not in buffered:
            chunk = read(0, 1 << 16)
            if not chunk:
                os._exit(0)
            buffered += chunk
        header, _, buffered = buffered.partition(b"\n")
        size = int(header)
        while len(buffered) < size:
            chunk = read(0, 1 << 16)
            if not chunk:
                os._exit(0)
            buffered += chunk
        request, buffered = buffered[:size], buffered[size:]
        code, out, err, cwd, *env = request.decode("utf-8", "surrogateescape").split("\0")
        pid = fork()
        if pid == 0:
            break
        write(1, b"%d\n" % pid)
        _, status = os.waitpid(pid, 0)
        write(1, b"%d\n" % os.waitstatus_to_exitcode(status))
    for fd, path in ((1, out), (2, err)):
        opened = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    opened = os.open(os.devnull, os.O_RDONLY)
    os.dup2(opened, 0)
    os.close(opened)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(item.split("=", 1) for item in env)
    names = globals()
    for name in [n for n in names if not (n.startswith("__") and n.endswith("__"))]:
        del names[name]
    return code


exec(compile(_serve(), "<string>", "exec"))
"""
"""The server. ``os`` and ``sys`` are bound only to be deleted in each child, with ``_serve``: a
fresh ``__main__`` has none of the three names."""

_PROBE = "import sys, json\nprint(json.dumps([sorted(sys.modules), sorted(globals())]))\n"
"""What a fresh interpreter holds (modules, and the names of ``__main__``), to check the server."""


class _Server:
    def __init__(self) -> None:
        self.env = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self.buffered = b""
        atexit.register(self.close)

    def serves(self, env: dict[str, str]) -> bool:
        """A call with ``env`` is run here: its start-up variables are the server's."""
        return {k: v for k, v in env.items() if k.startswith("PYTHON")} == self.env

    def run(self, code: str, cwd: str, env: dict[str, str], timeout: float) -> tuple[int, str, str]:
        """Exit status, stdout and stderr of ``code`` in a forked child."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with tempfile.TemporaryDirectory(prefix="fresh-") as scratch:
            out, err = os.path.join(scratch, "out"), os.path.join(scratch, "err")
            for path in (out, err):
                open(path, "wb").close()
            fields = [code, out, err, cwd, *(f"{k}={v}" for k, v in env.items())]
            request = "\0".join(fields).encode("utf-8", "surrogateescape")
            try:
                self.proc.stdin.write(b"%d\n" % len(request) + request)
                self.proc.stdin.flush()
                pid = int(self._line(timeout))
            except BaseException:
                self.kill()  # out of step with the server: the next call starts another
                raise
            try:
                status = int(self._line(timeout))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # it ended just now
                    os.kill(pid, signal.SIGKILL)
                try:
                    self._line(timeout)  # its status, once the server has reaped it
                except BaseException:
                    self.kill()
                raise
            except BaseException:
                self.kill()
                raise
            with open(out, encoding="utf-8", errors="replace") as f:
                stdout = f.read()
            with open(err, encoding="utf-8", errors="replace") as f:
                stderr = f.read()
        return status, stdout, stderr

    def _line(self, timeout: float) -> bytes:
        """The server's next line (a child's pid, then its exit status). Read with ``os.read``
        into a buffer of this object's own: the two lines often come in one read, and a
        buffered reader would hold the second where waiting on the pipe cannot see it."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.buffered:
                if not sel.select(timeout):
                    raise subprocess.TimeoutExpired([sys.executable, "-c", "..."], timeout)
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError("the fresh-interpreter server exited")
                self.buffered += chunk
        line, _, self.buffered = self.buffered.partition(b"\n")
        return line

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_server: _Server | None = None
_lock = threading.Lock()


def _started() -> _Server:
    """This process's server, started (and checked against a real fresh interpreter) once."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        server = _Server()
        env = dict(os.environ)
        real = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, env=env
        ).stdout
        status, forked, stderr = server.run(_PROBE, os.getcwd(), env, timeout=60)
        if status != 0 or json.loads(forked) != json.loads(real):
            server.close()
            raise RuntimeError(f"a forked child is not a fresh interpreter:\n{forked}{stderr}")
        _server = server
    return _server


def run(
    code: str,
    *,
    check: bool = False,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
    stdin=subprocess.DEVNULL, env=env, cwd=cwd)`` (by default this process's environment and
    working directory), by a fork of the server (a real interpreter when the environment's
    start-up variables are not the server's)."""
    args = [sys.executable, "-c", code]
    env = dict(os.environ if env is None else env)
    where = os.fspath(os.getcwd() if cwd is None else cwd)
    with _lock:
        server = _started()
        if server.serves(env):
            status, stdout, stderr = server.run(code, where, env, timeout)
            done = subprocess.CompletedProcess(args, status, stdout, stderr)
        else:
            done = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                env=env,
                cwd=where,
            )
    if check:
        done.check_returncode()
    return done


def modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    out = run(probe, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))
