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
