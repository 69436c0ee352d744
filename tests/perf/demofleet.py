"""The long benchmarks' machine: the embedded demo, the 8 live runs and strangers' processes, in one
config, as a new user meets runwatch on a shared machine.

:func:`demo_fleet` starts the demo exactly as ``runwatch demo --headless`` does (its mock servers on
loopback, its three runs), seeds and starts the 8 stand-in clients of :mod:`livefleet` in a work dir
of their own, and writes ONE config: the demo's, with the fleet's runs added to its host, every
process of the known scripts listed (``only_own_runs`` off, ``show_other_users`` on) and the
fleet's client among the scripts. :class:`Strangers` keeps :data:`STRANGERS` look-alike processes
running that the scanner lists but that are not the config's runs (a ``run_inference.py`` or a copy
of the fleet's client, other argv, other work dirs; every other one as the second Unix user when
this runs as root) and replaces the oldest every :data:`CHURN_S` seconds with one writing a dataset
of a new name: on a shared machine other people's runs come and go, each with a new pid and new
files, for as long as a watcher runs.
"""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from livefleet import CLIENT, CLIENT_NAME, make_fleet

from supervisor.config import DEFAULT_SCRIPTS
from supervisor.demo.launcher import new_demo, start_demo, stop_demo

STRANGERS = 6
CHURN_S = 20.0
"""Seconds between two replacements of a stranger (180 new strangers an hour)."""
SECOND_USER = "rwsafety"
"""The tests' second Unix user (``tests/fixtures_users.py``); created when missing, as there."""
DEMO_HOST = "laptop"
"""The demo config's host (``configs/demo.toml``): the fleet's runs are added to it."""


@dataclass
class DemoFleet:
    config: Path
    clients: list[subprocess.Popen[bytes]]
    strangers: Strangers
    demo_log: Path
    notes: list[str] = field(default_factory=list)


def second_user() -> pwd.struct_passwd | None:
    """The second Unix user, created like the tests' fixture does; None when not root."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        return None
    try:
        return pwd.getpwnam(SECOND_USER)
    except KeyError:
        pass
    r = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SECOND_USER],
        capture_output=True,
        check=False,
    )
    return pwd.getpwnam(SECOND_USER) if r.returncode == 0 else None


class Strangers:
    """Look-alike processes of others, replaced one at a time every :data:`CHURN_S` seconds."""

    def __init__(self, base: Path, user: pwd.struct_passwd | None) -> None:
        self.base = base
        self.user = user
        self.python = next(
            (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)),
            sys.executable,
        )
        self.live: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._churn, name="strangers", daemon=True)
        base.chmod(0o755)  # the second user's strangers run in here

    def _spawn(self) -> None:
        n = self.started
        self.started += 1
        other = self.user is not None and n % 2 == 1
        work = self.base / f"{'other' if other else 'mine'}{n % 3}"
        if not work.exists():
            work.mkdir()
            (work / "run_inference.py").write_text(CLIENT)
            (work / CLIENT_NAME).write_text(CLIENT)
            if other and self.user is not None:
                for p in (work, *work.iterdir()):
                    os.chown(p, self.user.pw_uid, self.user.pw_gid)
        script = "run_inference.py" if n % 4 != 3 else CLIENT_NAME
        argv = [self.python, script, "--datasets", f"S{n}a,S{n}b", "--output-dir", f"out{n}"]
        argv += ["--concurrency", "4", "--model", "theirs"]
        self.live.append(
            subprocess.Popen(
                argv,
                cwd=work,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                user=self.user.pw_uid if other and self.user is not None else None,
                group=self.user.pw_gid if other and self.user is not None else None,
                extra_groups=[] if other else None,
            )
        )

    def _retire(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _churn(self) -> None:
        while not self._stop.wait(CHURN_S):
            self._retire(self.live.pop(0))
            self._spawn()

    def start(self) -> None:
        for _ in range(STRANGERS):
            self._spawn()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        for p in self.live:
            self._retire(p)
        self.live.clear()


def _merged_config(demo_config: Path, fleet_config: Path, out: Path) -> None:
    """The demo's config with the fleet's runs and datasets on its host, strangers listed."""
    demo = demo_config.read_text()
    if "only_own_runs = true" not in demo or f'name = "{DEMO_HOST}"' not in demo:
        raise SystemExit(f"{demo_config}: not the demo config this benchmark knows")
    scripts = [*DEFAULT_SCRIPTS, CLIENT_NAME]
    top = "scripts = [" + ", ".join(f'"{s}"' for s in scripts) + "]\n"
    demo = demo.replace("only_own_runs = true", "only_own_runs = false\nshow_other_users = true")
    fleet = fleet_config.read_text()
    # The fleet's tables: everything from its first [[runs]], on the demo's host.
    runs = fleet[fleet.index("[[runs]]") :].replace('host = "bench"', f'host = "{DEMO_HOST}"')
    out.write_text(top + demo + "\n# The 8 live runs of tests/perf/livefleet.py\n" + runs)


@contextlib.contextmanager
def demo_fleet(tmp: Path) -> Iterator[DemoFleet]:
    """Start the demo, the fleet and the strangers under ``tmp``; stop them all on the way out."""
    demo = new_demo(tmp / "demo")
    demo.demo_dir.mkdir()
    log = tmp / "demo.out"
    strangers = Strangers(Path(tempfile.mkdtemp(prefix="runwatch-bench-strangers-")), second_user())
    clients: list[subprocess.Popen[bytes]] = []
    buf = io.StringIO()
    try:
        start_demo(demo, buf)
        fleet_config, argvs = make_fleet(tmp, None)
        config = tmp / "runwatch.toml"
        _merged_config(demo.config_path, fleet_config, config)
        clients = [
            subprocess.Popen(a, cwd=tmp / "work", stdin=subprocess.DEVNULL, start_new_session=True)
            for a in argvs
        ]
        strangers.start()
        notes = [] if strangers.user else ["not root: every stranger is this user's"]
        yield DemoFleet(config, clients, strangers, log, notes)
    finally:
        strangers.close()
        for c in clients:
            if c.poll() is None:
                c.kill()
            c.wait()
        stop_demo(demo, buf)
        log.write_text(buf.getvalue())
        shutil.rmtree(strangers.base, ignore_errors=True)
