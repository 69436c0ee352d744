"""``make soak``: the demo workload for N minutes under random faults, with an invariant checker.

    python -m tests.soak.run --minutes 10 [--seed S] [--interval 5] [--keep]

Set-up: a mock OpenAI-compatible server (``python -m supervisor.demo.server``), a real sshd on
127.0.0.1 (``tests.fixtures_sshd.SshdPool``), and two runs of the reference client with
``--ledger``: ``local`` on this machine and ``remote`` reached over that sshd. Both are launched,
and later acted on, only through the real CLI (``python -m supervisor.cli -c CONFIG ...``). Before
the first launch a decoy neighbourhood is started (``tests.soak.decoys``).

Faults, from a plan drawn once from the seed (the same seed and length give the same faults in the
same order; the processes' timing does not change the plan):

- ``restart``: ``runwatch restart RUN --set K=V ... --yes`` with random values, some invalid (a
  typo in the flag name, a value the client rejects, a ``--set`` without ``=``);
- ``kill``: ``runwatch kill RUN --yes``, then ``runwatch launch RUN --yes`` a few seconds later;
- ``sshd-freeze``: SIGSTOP the sshd listener and its sessions for a few seconds, then SIGCONT;
- ``rotate-rename`` / ``rotate-copytruncate`` of the data file a run is writing;
- ``other-user-writer``: a process of another Unix user holds a dataset file open for writing for
  a while;
- ``decoy-churn``: one more look-alike decoy is started.

Invariants, checked continuously by a thread polling /proc and the files (and at the end for
the ledgers):

- ``two-writers``: no process (other than a decoy) writes a dataset file that another process,
  started before it, also holds open for writing: a run launched beside an existing writer is
  reported once per launched process (processes are ordered by start time, not by the time they
  opened the file; a decoy writer the soak puts beside a running run is its own doing);
- ``decoy-signalled``: no decoy ever receives a signal, dies or is stopped;
- ``line-lost``: every line of a client's ledger is in a data file or a backup beside it (a rotated
  copy, ``.broken``, ``.torn``, a moved-aside file), except lines the soak's own copytruncate
  raced (counted apart, with the window);
- ``run-left-down``: after each runwatch action exits, the run is running (the same process alive
  for ``STABLE_S``) within ``BOUND_S``, unless the action was a kill or it reported failure with
  the run's process untouched.

Every violation is printed with its evidence (pids, start ticks, argv, files, offsets, the
runwatch command and its output). Exit status 1 on any violation, 0 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.soak import procs
from tests.soak.decoys import Neighbourhood

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "supervisor" / "demo" / "run_inference.py"
DATA_FILE = "raw_responses.jsonl"
OTHER_USER = "rwsoak"
BOUND_S = 40.0
"""How long after a runwatch action exits the run must be running again."""
STABLE_S = 4.0
"""How long one process of the run must stay alive to count as running."""
ACTION_TIMEOUT_S = 180.0
CHECK_EVERY_S = 0.5
COPYTRUNCATE_MARGIN_S = 1.0

VALID_SETS = {
    "concurrency": ["1", "2", "3"],
    "max-tokens": ["64", "96", "128"],
    "temperature": ["0.2", "0.7", "1.0"],
    "token-budget": ["100000000", "500000000"],
    "report-seconds": ["5", "10"],
}
SAMPLING_SETS = ("max-tokens", "temperature")
"""Flags the launch fingerprint covers: a restart changing them needs --allow-change."""
INVALID_SETS = [
    "token-buget=50000",  # typo in the flag name
    "concurency=2",
    "max-tokns=64",  # not "max-token": the client's argparse takes a prefix of --max-tokens
    "temprature=0.5",
    "concurrency=0",  # the client rejects the value
    "concurrency=two",
    "temperature=hot",
    "report-seconds=soon",
    "max-tokens",  # no value
]
FAULT_WEIGHTS = {
    "restart": 34,
    "kill": 10,
    "sshd-freeze": 12,
    "rotate-rename": 8,
    "rotate-copytruncate": 8,
    "other-user-writer": 12,
    "decoy-churn": 8,
    "quiet": 8,
}


@dataclass
class Fault:
    slot: int
    kind: str
    run: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"#{self.slot} {self.kind} {self.run} {extra}".rstrip()


def make_plan(seed: int, slots: int, runs: list[str]) -> list[Fault]:
    """The faults of a soak, drawn from ``seed`` alone."""
    rng = random.Random(seed)
    kinds = list(FAULT_WEIGHTS)
    weights = [FAULT_WEIGHTS[k] for k in kinds]
    plan = []
    for slot in range(slots):
        kind = rng.choices(kinds, weights)[0]
        run = rng.choice(runs)
        params: dict[str, Any] = {}
        if kind == "restart":
            keys = rng.sample(sorted(VALID_SETS), rng.randint(1, 2))
            sets = [f"{k}={rng.choice(VALID_SETS[k])}" for k in keys]
            if rng.random() < 0.4:
                bad = rng.choice(INVALID_SETS)
                # A later --set of the same flag would replace the bad value: keep it alone.
                sets = [x for x in sets if x.split("=")[0] != bad.split("=")[0]]
                sets.insert(rng.randint(0, len(sets)), bad)
            params["sets"] = sets
            params["invalid"] = any(s in INVALID_SETS for s in sets)
            # Sampling changes are blocked by the fingerprint gate unless allowed: allow most.
            if any(k in SAMPLING_SETS for k in keys) and rng.random() < 0.75:
                params["allow_change"] = "sampling"
        elif kind == "kill":
            params["relaunch_after"] = round(rng.uniform(1.0, 4.0), 1)
        elif kind == "sshd-freeze":
            run = "remote"
            params["seconds"] = round(rng.uniform(3.0, 12.0), 1)
        elif kind == "other-user-writer":
            params["seconds"] = round(rng.uniform(8.0, 30.0), 1)
        elif kind == "decoy-churn":
            params["decoy"] = rng.choice(["python-c-lookalike", "bash-c-wrapper", "tail-f"])
        plan.append(Fault(slot, kind, run, params))
    return plan


# --------------------------------------------------------------------------- the world


@dataclass
class Run:
    name: str
    host: str
    workdir: Path
    datasets: list[str]
    ledger: Path

    def data_file(self, dataset: str | None = None) -> Path:
        return self.workdir / "out" / (dataset or self.datasets[0]) / DATA_FILE

    def processes(self) -> list[tuple[int, int, list[str]]]:
        """(pid, start ticks, argv) of the live processes of this run: its client, recognised
        by its own ledger path in its argv (no decoy has one)."""
        out = []
        ledger = str(self.ledger)
        for pid in procs.pids():
            a = procs.argv(pid)
            if "--ledger" in a and ledger in a:
                s = procs.stat(pid)
                if s is not None and s[0] != "Z":
                    out.append((pid, s[1], a))
        return out


@dataclass
class Action:
    """One runwatch command the soak ran."""

    label: str
    argv: list[str]
    started: float
    ended: float = 0.0
    rc: int | None = None
    output: str = ""

    def evidence(self) -> dict[str, Any]:
        return {
            "action": self.label,
            "argv": self.argv[self.argv.index("-c") + 2 :] if "-c" in self.argv else self.argv,
            "rc": self.rc,
            "started": round(self.started, 3),
            "ended": round(self.ended, 3),
            "output_tail": self.output[-1500:],
        }


class Violations:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.keys: set[Any] = set()
        self.lock = threading.Lock()

    def add(self, kind: str, summary: str, evidence: dict[str, Any], key: Any = None) -> None:
        with self.lock:
            if key is not None:
                if (kind, key) in self.keys:
                    return
                self.keys.add((kind, key))
            item = {"kind": kind, "time": round(time.time(), 3), "summary": summary, **evidence}
            self.items.append(item)
        print(f"VIOLATION {kind}: {summary}", flush=True)


class Soak:
    def __init__(self, root: Path, seed: int, minutes: float, interval: float) -> None:
        self.root = root
        self.seed = seed
        self.minutes = minutes
        self.interval = interval
        self.violations = Violations()
        self.faults: Counter[str] = Counter()
        self.actions: Counter[str] = Counter()
        self.notes: list[str] = []
        self.history: list[Action] = []
        self.rotations: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.server: subprocess.Popen[bytes] | None = None
        self.pool: Any = None
        self.sshd: Any = None
        self.frozen_until = 0.0
        self.thaw: threading.Timer | None = None
        self.hood = Neighbourhood(root)
        self.other_user: str | None = None
        self.runs: dict[str, Run] = {}
        self.env = dict(os.environ)
        self.elapsed = 0.0

    # ------------------------------------------------------------------ set-up

    def setup(self) -> None:
        from supervisor.demo.prompts import write_prompts
        from supervisor.demo.tokenizer import ensure_demo_tokenizer
        from tests.fixtures_actions import host_toml
        from tests.fixtures_sshd import SshdPool

        self.root.chmod(0o755)  # the other user's decoy must reach its record file
        cache = self.root / "cache"
        tokenizer = ensure_demo_tokenizer(cache / "runwatch")
        self.env.update(
            {
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
                ),
                "XDG_STATE_HOME": str(self.root / "state"),
                "XDG_CACHE_HOME": str(cache),
            }
        )
        log = open(self.root / "mock-server.log", "ab")  # noqa: SIM115 - closed after spawn
        self.server = subprocess.Popen(
            [sys.executable, "-m", "supervisor.demo.server", "--port", "0", "--tokenizer",
             str(tokenizer), "--mean-tokens", "40", "--decode-tps", "200", "--model", "soak",
             "--seed", str(self.seed)],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
            env=self.env, start_new_session=True,
        )  # fmt: skip
        log.close()
        assert self.server.stdout is not None
        url = self.server.stdout.readline().decode().strip()
        if not url.startswith("http"):
            raise SystemExit(f"the mock server did not start: see {self.root / 'mock-server.log'}")
        self.url = url

        self.pool = SshdPool(self.root / "sshd")
        self.sshd = self.pool.start("soak-sshd", extra=["MaxSessions 20"])
        ssh_cfg = self.sshd.host_config("ssh127", command_timeout=60.0)

        prompts = max(2000, int(self.minutes * 60 * 10))
        for name, host, datasets in (
            ("local", "here", ["A1", "A2"]),
            ("remote", "ssh127", ["R1", "R2"]),
        ):
            workdir = self.root / f"work-{name}"
            write_prompts(workdir / "prompts", datasets, prompts)
            (workdir / "ledger").mkdir(parents=True)
            self.runs[name] = Run(
                name, host, workdir, datasets, workdir / "ledger" / "ledger.jsonl"
            )
        write_prompts(self.runs["local"].workdir / "prompts", ["X1"], prompts)
        elsewhere = self.root / "elsewhere" / "work-remote"
        write_prompts(elsewhere / "prompts", ["R1"], prompts)

        lines = ['[[hosts]]\nname = "here"\nlocal = true', f"python = {json.dumps(sys.executable)}"]
        lines.append(host_toml(ssh_cfg))
        for run in self.runs.values():
            argv = [sys.executable, str(CLIENT), "--datasets", ",".join(run.datasets)]
            argv += ["--prompts-dir", "prompts", "--output-dir", "out", "--api-base", self.url]
            argv += ["--model", "soak", "--concurrency", "2", "--max-tokens", "96"]
            argv += ["--report-seconds", "10", "--ledger", str(run.ledger)]
            lines += [
                "[[runs]]",
                f'name = "{run.name}"',
                f'host = "{run.host}"',
                f"workdir = {json.dumps(str(run.workdir))}",
                "argv = [" + ", ".join(json.dumps(a) for a in argv) + "]",
                'output_dir = "out"',
                f'log = "logs/{run.name}.log"',
                "stop_grace_seconds = 3.0",
                "",
            ]
        self.config = self.root / "runwatch.toml"
        self.config.write_text("\n".join(lines) + "\n")

        # The neighbourhood comes first: these processes were there before the runs.
        local = self.runs["local"]
        self.hood.client_copy(CLIENT, local.workdir, "X1", self.url, "same-workdir")
        self.hood.client_copy(CLIENT, elsewhere, "R1", self.url, "elsewhere-same-suffix")
        self.hood.python_lookalike(local.workdir, ",".join(local.datasets))
        self.hood.bash_wrapper(local.workdir, ",".join(local.datasets))
        self.hood.python_lookalike(self.runs["remote"].workdir, "R1,R2")
        local.data_file().parent.mkdir(parents=True, exist_ok=True)
        self.hood.tail_follower(local.workdir, Path("out") / local.datasets[0] / DATA_FILE)
        self.other_user = self._ensure_user()

        for run in self.runs.values():
            action = self.cli("launch (set-up)", "launch", run.name, "--yes")
            if action.rc != 0 or self.wait_running(run, BOUND_S) is None:
                decoys = {d.pid: d.kind for d in self.hood.decoys}
                self.notes.append(
                    f"set-up: launch {run.name} exited {action.rc} and it is not running "
                    f"(decoys: {decoys}): {action.output.strip()[-600:]}"
                )
                print(f"note: {self.notes[-1]}", flush=True)

    def _ensure_user(self) -> str | None:
        try:
            pwd.getpwnam(OTHER_USER)
            return OTHER_USER
        except KeyError:
            pass
        if os.getuid() != 0:
            self.notes.append(f"not root: no user {OTHER_USER}, other-user-writer faults skipped")
            return None
        r = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            self.notes.append(f"useradd {OTHER_USER} failed: {r.stderr.strip()}")
            return None
        return OTHER_USER

    # ------------------------------------------------------------------ runwatch

    def cli(self, label: str, *args: str) -> Action:
        argv = [sys.executable, "-m", "supervisor.cli", "-c", str(self.config), *args]
        action = Action(label, argv, time.time())
        with self.lock:
            self.history.append(action)
        try:
            r = subprocess.run(
                argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=ACTION_TIMEOUT_S,
            )
            action.rc, action.output = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"") + (e.stderr or b"")
            action.output = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
            action.rc = None
        action.ended = time.time()
        with open(self.root / "actions.jsonl", "a") as log:
            log.write(json.dumps({**action.evidence(), "output": action.output}) + "\n")
        self.actions[f"{label} rc={action.rc if action.rc is not None else 'timeout'}"] += 1
        return action

    def recent_actions(self, since: float) -> list[Action]:
        """The last runwatch commands running or ended since ``since`` (rendered at report time,
        so that one still running when a violation is seen shows how it ended)."""
        with self.lock:
            return [a for a in self.history if a.ended == 0.0 or a.ended >= since][-3:]

    def wait_running(self, run: Run, bound: float) -> tuple[int, int, list[str]] | None:
        """The run's process once one has been alive for ``STABLE_S``, or None after ``bound``."""
        deadline = time.monotonic() + bound
        first_seen: dict[tuple[int, int], float] = {}
        while True:
            now = time.monotonic()
            live = run.processes()
            for pid, start, argv in live:
                seen = first_seen.setdefault((pid, start), now)
                if now - seen >= STABLE_S:
                    return pid, start, argv
            if now > deadline:
                return None
            time.sleep(0.2)  # polling interval of a condition wait

    def check_left_down(
        self, run: Run, action: Action, before: list[tuple[int, int, list[str]]]
    ) -> None:
        """``run-left-down``: after ``action``, the run is running within the bound, unless the
        action reported failure and left the run's processes as they were."""
        untouched = all(procs.alive(pid, start) for pid, start, _ in before)
        if action.rc not in (0, None) and untouched:
            return  # reported failure, and stopped nothing (or the run was down already)
        if self.wait_running(run, BOUND_S) is not None:
            return
        log = run.workdir / "logs" / f"{run.name}.log"
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        self.violations.add(
            "run-left-down",
            f"{run.name} not running {BOUND_S:g} s after `{' '.join(action.evidence()['argv'])}` "
            f"exited {action.rc}",
            {
                "run": run.name,
                "processes_before": [{"pid": p, "start_ticks": s, "argv": a} for p, s, a in before],
                "processes_now": [{"pid": p, "start_ticks": s} for p, s, _ in run.processes()],
                "runwatch": action.evidence(),
                "run_log_tail": tail,
            },
        )
        self.recover(run)

    def recover(self, run: Run) -> None:
        """Bring a run that is down back (the operator's launch), so the soak goes on."""
        action = self.cli("launch (recovery)", "launch", run.name, "--yes")
        if action.rc != 0 and "stopped at fingerprint" in action.output:
            # The config's argv differs from the last launch (a restart's --set is not kept)
            # and launch has no --allow-change: what an operator can do is a restart.
            action = self.cli(
                "restart (recovery, --allow-change sampling)",
                *("restart", run.name, "--allow-change", "sampling", "--yes"),
            )
        if action.rc == 0 and self.wait_running(run, BOUND_S) is not None:
            return
        first = action.output.strip().splitlines()[:1]
        self.notes.append(
            f"{run.name}: recovery launch failed (rc {action.rc}): {first[0] if first else ''}"
        )

    # ------------------------------------------------------------------ faults

    def inject(self, f: Fault) -> None:
        run = self.runs[f.run]
        label = f.kind
        if f.kind == "restart":
            label = "restart-invalid" if f.params["invalid"] else "restart-valid"
        self.faults[label] += 1
        print(f"[{time.strftime('%H:%M:%S')}] fault {f.describe()}", flush=True)
        if f.kind == "restart":
            before = run.processes()
            args = [a for s in f.params["sets"] for a in ("--set", s)]
            if "allow_change" in f.params:
                args += ["--allow-change", f.params["allow_change"]]
            action = self.cli(label, "restart", run.name, *args, "--yes")
            self.check_left_down(run, action, before)
        elif f.kind == "kill":
            action = self.cli("kill", "kill", run.name, "--yes", "--grace", "3")
            if action.rc == 0 and run.processes():
                self.notes.append(
                    f"kill {run.name} exited 0 but {[p for p, _, _ in run.processes()]} remain"
                )
            self._pause(f.params["relaunch_after"])
            before = run.processes()
            action = self.cli("launch (after kill)", "launch", run.name, "--yes")
            self.check_left_down(run, action, before)
        elif f.kind == "sshd-freeze":
            self.freeze_sshd(f.params["seconds"])
        elif f.kind in ("rotate-rename", "rotate-copytruncate"):
            self.rotate(run, f.kind, f.slot)
        elif f.kind == "other-user-writer":
            if self.other_user is None:
                self.skip(label, f"{f.describe()}: no other user")
                return
            path = run.data_file()
            if not path.exists():
                self.skip(label, f"{f.describe()}: {path} missing")
                return
            decoy = self.hood.other_user_writer(self.other_user, path)
            timer = threading.Timer(f.params["seconds"], decoy.retire)
            timer.daemon = True
            timer.start()
        elif f.kind == "decoy-churn":
            local = self.runs["local"]
            kind = f.params["decoy"]
            if kind == "python-c-lookalike":
                self.hood.python_lookalike(run.workdir, ",".join(run.datasets))
            elif kind == "bash-c-wrapper":
                self.hood.bash_wrapper(run.workdir, ",".join(run.datasets))
            else:
                self.hood.tail_follower(local.workdir, Path("out") / local.datasets[0] / DATA_FILE)

    def skip(self, label: str, why: str) -> None:
        """A planned fault that found nothing to act on: counted apart from the injected ones."""
        self.faults[label] -= 1
        self.faults[f"{label} (skipped)"] += 1
        self.notes.append(f"skipped {why}")

    def _pause(self, seconds: float) -> None:
        self.stop.wait(seconds)  # the soak's own pacing, not a synchronisation

    def freeze_sshd(self, seconds: float) -> None:
        self.sshd.proc.send_signal(signal.SIGSTOP)
        self.sshd.signal_sessions(signal.SIGSTOP)
        self.frozen_until = time.monotonic() + seconds
        if self.thaw is not None:
            self.thaw.cancel()
        self.thaw = threading.Timer(seconds, self.thaw_sshd)
        self.thaw.daemon = True
        self.thaw.start()

    def thaw_sshd(self) -> None:
        self.sshd.signal_sessions(signal.SIGCONT)
        with contextlib.suppress(ProcessLookupError):
            self.sshd.proc.send_signal(signal.SIGCONT)

    def rotate(self, run: Run, kind: str, slot: int) -> None:
        """Rotate the data file the run writes: rename + new file, or copy + truncate."""
        path = run.data_file()
        if not path.exists():
            self.skip(kind, f"rotate {run.name}: {path} missing")
            return
        backup = path.with_name(f"{DATA_FILE}.rot-{slot}")
        record: dict[str, Any] = {"kind": kind, "path": str(path), "backup": str(backup)}
        st = path.stat()
        record.update(dev=st.st_dev, ino=st.st_ino, t_start=time.time())
        if kind == "rotate-rename":
            os.rename(path, backup)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
        else:
            with open(path, "rb") as src, open(backup, "wb") as dst:
                shutil.copyfileobj(src, dst)
                record["copied"] = dst.tell()
            with open(path, "r+b") as f:
                record["size_at_truncate"] = os.fstat(f.fileno()).st_size
                f.truncate(0)
        record["t_end"] = time.time()
        self.rotations.append(record)

    # ------------------------------------------------------------------ the checker

    def checker(self) -> None:
        while not self.stop.is_set():
            try:
                self.check_decoys()
                self.check_writers()
            except Exception as e:  # a checker bug must show, not end the soak silently
                self.notes.append(f"checker error: {type(e).__name__}: {e}")
            self.stop.wait(CHECK_EVERY_S)  # the checker's polling period

    def check_decoys(self) -> None:
        for d in list(self.hood.decoys):
            lines = d.record.read_text(errors="replace").splitlines()
            if len(lines) > d.seen_records:
                new = lines[d.seen_records :]
                d.seen_records = len(lines)
                self.violations.add(
                    "decoy-signalled",
                    f"decoy {d.kind} pid {d.pid} caught {', '.join(x.split()[-1] for x in new)}",
                    {
                        "decoy": d.evidence(),
                        "signals": new,
                        "runwatch": self.recent_actions(time.time() - 30),
                    },
                    key=(d.pid, len(lines)),
                )
            if d.retired or d.reported:
                continue
            rc = d.proc.poll()
            st = procs.stat(d.pid)
            if rc is None and (st is None or st[0] not in "Tt"):
                continue
            if d.retired:  # retired by the soak between the two reads
                continue
            d.reported = True
            if rc is None:
                how = f"stopped (state {st[0] if st else '?'})"
            elif rc < 0:
                how = f"killed by {signal.Signals(-rc).name}"
            else:
                how = f"exited with status {rc}"
            self.violations.add(
                "decoy-signalled",
                f"decoy {d.kind} pid {d.pid} {how}",
                {
                    "decoy": d.evidence(),
                    "returncode": rc,
                    "runwatch": self.recent_actions(time.time() - 30),
                },
                key=(d.pid, "dead"),
            )

    def check_writers(self) -> None:
        with self.hood.lock:  # no decoy starts between listing the decoys and the writers
            decoys = {d.pid: d for d in self.hood.decoys}
            writers = procs.writers_under(str(self.root), DATA_FILE)
        for (dev, ino), found in writers.items():
            ws = [w for w in found if w.pid != os.getpid()]  # the soak's own rotation
            # A writer that joined a file another process was already writing (it started
            # later) is the fault; a decoy never is (the soak put it there on purpose).
            joined = [
                w
                for w in ws
                if w.pid not in decoys and any(o.pid != w.pid and o.start <= w.start for o in ws)
            ]
            for w in joined:
                self.violations.add(
                    "two-writers",
                    f"pid {w.pid} started writing {w.path} (inode {ino}) beside "
                    f"{len(ws) - 1} other writer(s): "
                    + ", ".join(
                        f"pid {x.pid}" + (f" ({decoys[x.pid].kind})" if x.pid in decoys else "")
                        for x in ws
                        if x is not w
                    ),
                    {
                        "file": w.path,
                        "dev": dev,
                        "ino": ino,
                        "writers": [
                            {
                                **x.to_json(),
                                "decoy": decoys[x.pid].kind if x.pid in decoys else None,
                                "joined_last": x is w,
                            }
                            for x in ws
                        ],
                        "runwatch": self.recent_actions(time.time() - 30),
                    },
                    key=(ino, w.pid, w.start),
                )

    # ------------------------------------------------------------------ the ledgers

    def check_ledgers(self) -> dict[str, int]:
        """``line-lost``: every ledger entry's line is in a file under the run's output dir."""
        stats: Counter[str] = Counter()
        for run in self.runs.values():
            entries = []
            if run.ledger.exists():
                for raw in run.ledger.read_bytes().splitlines():
                    with contextlib.suppress(ValueError):
                        entries.append(json.loads(raw))
            hashes: dict[str, str] = {}
            for path in sorted((run.workdir / "out").rglob("*")):
                if not path.is_file():
                    continue
                with open(path, "rb") as f:
                    for line in f:
                        if line.endswith(b"\n"):
                            hashes.setdefault(hashlib.sha1(line).hexdigest(), str(path))
            stats[f"{run.name} ledger lines"] = len(entries)
            for e in entries:
                if e["sha1"] in hashes:
                    stats[f"{run.name} found"] += 1
                    continue
                race = self._copytruncate_race(e)
                if race is not None:
                    stats[f"{run.name} lost to the soak's own copytruncate race"] += 1
                    continue
                self.violations.add(
                    "line-lost",
                    f"{run.name}: {e['sample_id']} written at {e['file']}:{e['offset']} "
                    f"(inode {e['ino']}) is in no file",
                    {"ledger_entry": e, "at_offset_now": self._bytes_at(e)},
                    key=(e["sha1"], e["offset"]),
                )
                stats[f"{run.name} lost"] += 1
        return dict(stats)

    def _copytruncate_race(self, e: dict[str, Any]) -> dict[str, Any] | None:
        for r in self.rotations:
            if r["kind"] != "rotate-copytruncate" or r["ino"] != e["ino"]:
                continue
            if r["t_start"] <= e["time"] <= r["t_end"] + COPYTRUNCATE_MARGIN_S:
                return r
        return None

    def _bytes_at(self, e: dict[str, Any]) -> str:
        """What is now at the entry's offset in the file that has its inode (a rename moves
        the line with the inode), else at its path."""
        path = e["file"]
        for candidate in self.root.rglob(f"{DATA_FILE}*"):
            with contextlib.suppress(OSError):
                st = candidate.stat()
                if (st.st_dev, st.st_ino) == (e["dev"], e["ino"]):
                    path = str(candidate)
                    break
        try:
            with open(path, "rb") as f:
                f.seek(e["offset"])
                data = f.read(e["length"])
            st = os.stat(path)
        except OSError as err:
            return f"{path}: {err.strerror}"
        return (
            f"{path} (inode {st.st_ino}, size {st.st_size}) holds there {data[:120]!r} "
            f"(sha1 {hashlib.sha1(data).hexdigest()})"
        )

    # ------------------------------------------------------------------ main loop

    def run(self) -> int:
        plan = make_plan(self.seed, max(1, int(self.minutes * 60 / self.interval)), list(self.runs))
        print(f"soak: seed {self.seed}, {len(plan)} faults planned over {self.minutes:g} min "
              f"(replay: --seed {self.seed} --minutes {self.minutes:g}); dir {self.root}",
              flush=True)  # fmt: skip
        checker = threading.Thread(target=self.checker, name="checker", daemon=True)
        checker.start()
        t0 = time.monotonic()
        for i, f in enumerate(plan):
            next_at = t0 + i * self.interval
            self._pause(max(0.0, next_at - time.monotonic()))  # the soak's pacing
            for run in self.runs.values():
                if not run.processes():
                    self.recover(run)
            if f.kind != "quiet":
                self.inject(f)
            else:
                self.faults["quiet"] += 1
        if self.thaw is not None:
            self.thaw.cancel()
        self.thaw_sshd()
        self._pause(CHECK_EVERY_S * 3)
        self.stop.set()
        checker.join(30)
        ledger = self.check_ledgers()
        self.elapsed = time.monotonic() - t0
        self.report(ledger)
        return 1 if self.violations.items else 0

    def report(self, ledger: dict[str, int]) -> None:
        (self.root / "violations.json").write_text(
            json.dumps(self.violations.items, indent=1, default=_render)
        )
        print("\n== soak report")
        print(f"seed {self.seed}; replay: python -m tests.soak.run --seed {self.seed} "
              f"--minutes {self.minutes:g} --interval {self.interval:g}")  # fmt: skip
        print(f"ran {self.elapsed / 60:.1f} min ({self.interval:g} s between planned faults)")
        print("faults injected:")
        for k, n in sorted((k, n) for k, n in self.faults.items() if n):
            print(f"  {k:<24} {n}")
        print("runwatch actions (by exit status):")
        for k, n in sorted(self.actions.items()):
            print(f"  {k:<40} {n}")
        print("ledgers:")
        for k, n in sorted(ledger.items()):
            print(f"  {k:<50} {n}")
        print("decoys started:", Counter(d.kind for d in self.hood.decoys))
        kinds = Counter(v["kind"] for v in self.violations.items)
        print(f"violations: {len(self.violations.items)} {dict(kinds)}")
        for n, v in enumerate(self.violations.items, 1):
            print(f"\n-- violation {n}: {v['kind']}: {v['summary']}")
            rest = {k: x for k, x in v.items() if k not in ("kind", "summary")}
            print(json.dumps(rest, indent=1, default=_render))
        for note, n in Counter(self.notes).items():
            print(f"note: {note}" + (f" (x{n})" if n > 1 else ""))
        print(f"\nevidence also in {self.root / 'violations.json'}; every runwatch command and "
              f"its output in {self.root / 'actions.jsonl'}")  # fmt: skip

    def close(self) -> None:
        self.stop.set()
        if self.thaw is not None:
            self.thaw.cancel()
        if self.sshd is not None:
            self.thaw_sshd()
        for run in self.runs.values():
            for pid, _start, _ in run.processes():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
        self.hood.close()
        if self.server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait(10)
        if self.pool is not None:
            self.pool.close()


def _render(obj: object) -> object:
    if isinstance(obj, Action):
        return obj.evidence()
    raise TypeError(f"not JSON: {type(obj).__name__}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=None, help="replay a soak (default: random)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between faults")
    p.add_argument("--dir", default=None, help="working directory (default: a new temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    root = Path(args.dir or tempfile.mkdtemp(prefix="runwatch-soak-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    soak = Soak(root, seed, args.minutes, args.interval)
    print(f"soak: seed {seed}", flush=True)
    try:
        soak.setup()
        return soak.run()
    finally:
        soak.close()
        if not args.keep and not soak.violations.items:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
