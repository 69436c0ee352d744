"""``tests.fresh``: each call is a fresh interpreter (the import checks that use it can fail as
they could with an interpreter per check), and reports as ``subprocess.run`` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fresh


def test_a_call_sees_nothing_an_earlier_call_imported() -> None:
    assert "tomllib" in fresh.modules_after("import tomllib")
    assert "tomllib" not in fresh.modules_after("pass")


def test_a_call_holds_what_a_real_fresh_interpreter_holds() -> None:
    probe = "import sys, json\nprint(json.dumps([sorted(sys.modules), sorted(globals())]))\n"
    real = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(fresh.run(probe, check=True).stdout) == json.loads(real.stdout)


def test_exit_status_output_and_errors_are_the_interpreters(tmp_path: Path) -> None:
    done = fresh.run("import sys\nprint('out')\nsys.stderr.write('err')\nsys.exit(3)")
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err")
    failed = fresh.run("raise ValueError('boom')")
    assert failed.returncode == 1 and "ValueError: boom" in failed.stderr
    with pytest.raises(subprocess.CalledProcessError):
        fresh.run("raise SystemExit(2)", check=True)
    code = "import atexit, os\natexit.register(print, 'bye')\nprint(os.getcwd(), os.environ['X'])"
    here = fresh.run(code, cwd=tmp_path, env={**os.environ, "X": "y"}, check=True)
    assert here.stdout == f"{tmp_path} y\nbye\n"


def test_a_call_that_hangs_is_stopped_at_its_timeout() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        fresh.run("import threading\nthreading.Event().wait()", timeout=0.5)
    assert fresh.run("print(1)").stdout == "1\n"


def test_quick_calls_in_a_row_each_get_their_own_answer() -> None:
    """A quick child's pid and exit status often reach the caller in one read."""
    for n in range(10):
        done = fresh.run(f"print({n})\nraise SystemExit({n})", timeout=30)
        assert (done.returncode, done.stdout) == (n, f"{n}\n")


def test_two_answers_that_come_in_one_read_are_both_seen() -> None:
    """The server's pid and status lines, when they come in one write on a pipe that stays open,
    are two answers: the second is not left in a buffer the wait on the pipe cannot see."""
    server = fresh._Server.__new__(fresh._Server)
    server.buffered = b""
    server.proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert server.proc.stdin is not None and server.proc.stdout is not None
    try:
        server.proc.stdin.write(b"41\n3\n")  # one write, which cat passes on as one
        server.proc.stdin.flush()
        assert (server._line(30), server._line(5)) == (b"41", b"3")
    finally:
        server.proc.stdin.close()
        server.proc.wait(timeout=30)
        server.proc.stdout.close()
