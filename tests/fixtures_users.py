"""A second Unix user for the tests where ownership matters.

``second_user``: a system user ``rwsafety`` (created with ``useradd`` when missing; the tests run as
root), with ``prefix`` that runs a command as it (``setpriv``) and ``python``, an interpreter it can
execute. Skipped with the reason where this is impossible (not root, no setpriv or useradd).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
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


@pytest.fixture(scope="session")
def second_user() -> OtherUser:
    setpriv, useradd, python = shutil.which("setpriv"), shutil.which("useradd"), system_python()
    if os.geteuid() != 0 or setpriv is None or useradd is None or python is None:
        pytest.skip("needs root, setpriv, useradd and a system python3 to act as a second user")
    try:
        entry = pwd.getpwnam(SECOND_USER)
    except KeyError:
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SECOND_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(SECOND_USER)
    prefix = [
        setpriv,
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--clear-groups",
    ]
    return OtherUser(SECOND_USER, entry.pw_uid, entry.pw_gid, prefix, python)
