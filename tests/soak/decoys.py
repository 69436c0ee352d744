"""The decoy neighbourhood: processes that look like a run, or sit beside one, and must never be
signalled by runwatch.

Python and bash decoys write every signal they catch to their own record file (SIGKILL and SIGSTOP
cannot be caught: the checker sees those as a death or a stopped state). Every decoy is a child of
the soak, so its exit status is known exactly; the soak itself only ever retires a decoy with
SIGKILL after marking it retired.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.soak import procs

# Catches every catchable signal, writes its name to the record file, and keeps going.
PY_DECOY = r"""
import os, signal, sys, time
rec = os.environ["SOAK_DECOY_RECORD"]
def on(sig, frame):
    with open(rec, "a") as f:
        f.write("%.3f %s\n" % (time.time(), signal.Signals(sig).name))
for s in signal.valid_signals():
    if s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGWINCH):
        continue
    try:
        signal.signal(s, on)
    except (OSError, ValueError):
        pass
# looks like: run_inference.py --datasets ... (this text is the look-alike)
while True:
    signal.pause()
"""

# Another user's appender: opens, appends one record and closes, every 0.25 s; notes the time of
# each append that worked in its appends file.
PY_OAC = PY_DECOY.replace(
    "while True:\n    signal.pause()",
    """import json
data, appends, n = sys.argv[1], sys.argv[2], 0
while True:
    n += 1
    rec = {"sample_id": "OAC-%d-%d" % (os.getpid(), n), "output_ids": [1, 2, 3],
           "prompt_tokens": 3, "completion_tokens": 3, "finish_reason": "stop"}
    line = json.dumps(rec) + "\\n"
    try:
        with open(data, "a") as f:
            f.write(line)
        with open(appends, "a") as f:
            f.write("%.3f\\n" % time.time())
    except OSError:
        pass
    time.sleep(0.25)""",
)

# A shell loop appending with `>>` (bash opens and closes the file around each builtin printf).
BASH_OAC = (
    "for s in TERM INT HUP USR1 USR2 QUIT ALRM; do "
    'trap "echo $(date +%s.%N) $s >> \\"$SOAK_DECOY_RECORD\\"" $s; done; n=0; '
    "while :; do n=$((n+1)); "
    """printf '{"sample_id": "SH-%s-%s", "output_ids": [1, 2, 3], """
    """"prompt_tokens": 3, "completion_tokens": 3, "finish_reason": "stop"}\\n' $$ $n """
    """>> "$1" && date +%s.%N >> "$2"; sleep 0.25; done"""
)

BASH_DECOY = (
    ": python3 run_inference.py --datasets {datasets} --output-dir out; "
    "for s in TERM INT HUP USR1 USR2 QUIT ALRM; do "
    'trap "echo $(date +%s.%N) $s >> \\"$SOAK_DECOY_RECORD\\"" $s; done; '
    "while :; do sleep 30 & wait $!; done"
)


@dataclass
class Decoy:
    kind: str
    proc: subprocess.Popen[bytes]
    argv: list[str]
    cwd: str
    record: Path
    start: int
    retired: bool = False
    reported: bool = False
    seen_records: int = 0
    note: dict[str, object] = field(default_factory=dict)
    appends: Path | None = None
    """An appender's log of the times it appended (None: the decoy does not write)."""
    retired_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def evidence(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "pid": self.pid,
            "start_ticks": self.start,
            "argv": self.argv,
            "cwd": self.cwd,
            **self.note,
        }

    def retire(self) -> None:
        """Stop it on purpose (the soak's own doing, never counted as a violation)."""
        self.retired = True
        self.retired_at = time.time()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class Neighbourhood:
    """Starts decoys and keeps them, retired or not, for the checker."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "decoys"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.decoys: list[Decoy] = []
        self._n = 0
        self.lock = threading.Lock()
        """Held while a decoy starts: whoever holds it sees every decoy process as one."""

    def _start(
        self,
        kind: str,
        argv: list[str],
        cwd: Path,
        *,
        user: str | None = None,
        pass_fds: tuple[int, ...] = (),
        env: dict[str, str] | None = None,
    ) -> Decoy:
        with self.lock:
            self._n += 1
            record = self.dir / f"{self._n:03d}-{kind}.signals"
            record.touch()
            if user is not None:
                shutil.chown(record, user)
            log = open(self.dir / f"{self._n:03d}-{kind}.log", "ab")  # noqa: SIM115 - child owns it
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={**(env or os.environ), "SOAK_DECOY_RECORD": str(record)},
                user=user,
                pass_fds=pass_fds,
            )
            log.close()
            s = procs.stat(proc.pid)
            decoy = Decoy(kind, proc, argv, str(cwd), record, s[1] if s else -1)
            self.decoys.append(decoy)
        return decoy

    def python_lookalike(self, cwd: Path, datasets: str) -> Decoy:
        argv = ["python3", "-c", PY_DECOY, "run_inference.py", "--datasets", datasets]
        return self._start("python-c-lookalike", [*argv, "--output-dir", "out"], cwd)

    def tail_follower(self, cwd: Path, data_file: Path) -> Decoy:
        return self._start("tail-f", ["tail", "-F", str(data_file)], cwd)

    def bash_wrapper(self, cwd: Path, datasets: str) -> Decoy:
        script = BASH_DECOY.format(datasets=datasets)
        return self._start("bash-c-wrapper", ["bash", "-c", script, "run_inference.py"], cwd)

    def client_copy(
        self, client: Path, cwd: Path, datasets: str, api_base: str, where: str
    ) -> Decoy:
        """A real copy of the reference client (another path), writing other files."""
        copy_dir = self.root / "elsewhere" / "bin"
        copy_dir.mkdir(parents=True, exist_ok=True)
        copy = copy_dir / client.name
        if not copy.exists():
            shutil.copyfile(client, copy)
        argv = [sys.executable, str(copy), "--datasets", datasets, "--prompts-dir", "prompts"]
        argv += ["--output-dir", "out", "--api-base", api_base, "--model", "soak"]
        argv += ["--concurrency", "1", "--report-seconds", "60"]
        return self._start(f"client-copy-{where}", argv, cwd)

    def other_user_writer(self, user: str, data_file: Path) -> Decoy:
        """A process of ``user`` holding ``data_file`` open for writing (the descriptor is opened
        here and inherited: the file's mode does not let that user open it)."""
        fd = os.open(data_file, os.O_WRONLY | os.O_APPEND)
        try:
            decoy = self._start(
                "other-user-writer",
                ["python3", "-c", PY_DECOY, str(data_file)],
                Path("/"),
                user=user,
                pass_fds=(fd,),
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            )
        finally:
            os.close(fd)
        decoy.note["holds"] = str(data_file)
        return decoy

    def appender(self, kind: str, data_file: Path, user: str | None = None) -> Decoy:
        """A writer that is not a run: opens ``data_file``, appends a record and closes it, every
        0.25 s; ``kind`` ``oac-other-user`` (a Python appender of ``user``; the file is made
        writable for it) or ``oac-shell`` (a ``bash`` loop with ``>>``). The time of each append
        is in the decoy's ``appends`` file."""
        appends = self.dir / f"{self._n + 1:03d}-{kind}.appends"
        appends.touch()
        if kind == "oac-other-user":
            if user is None:
                raise ValueError("an other-user appender needs a user")
            shutil.chown(appends, user)
            os.chmod(data_file, 0o666)
            argv = ["python3", "-c", PY_OAC, str(data_file), str(appends)]
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            decoy = self._start(kind, argv, Path("/"), user=user, env=env)
        elif kind == "oac-shell":
            argv = ["bash", "-c", BASH_OAC, "oac", str(data_file), str(appends)]
            decoy = self._start(kind, argv, data_file.parent)
        else:
            raise ValueError(f"unknown appender {kind!r}: oac-other-user or oac-shell")
        decoy.appends = appends
        decoy.note["appends_to"] = str(data_file)
        return decoy

    def append_times(self, decoy: Decoy) -> list[float]:
        if decoy.appends is None:
            return []
        try:
            text = decoy.appends.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                out.append(float(line))
        return out

    def live(self) -> list[Decoy]:
        return [d for d in self.decoys if not d.retired]

    def pids(self) -> set[int]:
        return {d.pid for d in self.decoys}

    def close(self) -> None:
        for d in self.decoys:
            if not d.retired and d.proc.poll() is None:
                d.retire()
