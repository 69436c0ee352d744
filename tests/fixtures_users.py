"""A second Unix user for the tests where ownership matters.

``second_user``: a system user ``rwsafety`` (created with ``useradd`` when missing; the tests run as
root), with ``prefix`` that runs a command as it (``setpriv``) and ``python``, an interpreter it can
execute. Skipped with the reason where this is impossible (not root, no setpriv or useradd).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import pytest

from tests.fixtures_procs import system_python

SECOND_USER = "rwsafety"


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int
    prefix: list[str]
    """Runs the command that follows as this user (``setpriv --reuid ... --regid ...``)."""
    python: str


def _ensure_user(useradd: str) -> pwd.struct_passwd:
    """The second user's entry, created first when missing: one test worker at a time (a lock
    on a file every worker sees), since two ``useradd`` at once fail on ``/etc/passwd``'s lock."""
    with open(os.path.join(tempfile.gettempdir(), "runwatch-tests-useradd.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(SECOND_USER)
        except KeyError:
            pass
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SECOND_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SECOND_USER)


@pytest.fixture(scope="session")
def second_user() -> OtherUser:
    setpriv, useradd, python = shutil.which("setpriv"), shutil.which("useradd"), system_python()
    if os.geteuid() != 0 or setpriv is None or useradd is None or python is None:
        pytest.skip("needs root, setpriv, useradd and a system python3 to act as a second user")
    entry = _ensure_user(useradd)
    prefix = [
        setpriv,
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
    ]
    return OtherUser(SECOND_USER, entry.pw_uid, entry.pw_gid, prefix, python)
