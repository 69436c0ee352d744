"""``make soak``: the demo workload for N minutes under random faults, with an invariant checker.

    python -m tests.soak.run --minutes 10 [--seed S] [--interval 5] [--keep] [--faults K,K]

(``--faults``: only those kinds in the plan, e.g. ``die,watcher-kill,finish,stop``.)

Set-up: a mock OpenAI-compatible server (``python -m supervisor.demo.server``), a real sshd on
127.0.0.1 (``tests.fixtures_sshd.SshdPool``), and eleven runs, launched, and later acted on,
only through the real CLI (``python -m supervisor.cli -c CONFIG ...``): two of the reference
client with ``--ledger``, ``local`` on this machine and ``remote`` reached over that sshd; five of
the reference client wrapped by ``tests.soak.adversaries`` (``escape``: its SIGTERM handler leaves
a ``setsid`` writer behind; ``daemon``: a double-forked open-append-close daemon; ``renamed``:
re-execs under another ``argv[0]``; ``twin-a`` and ``twin-b``: the same argv in two workdirs,
recording the signals they catch); and ``sf``, the SpecForge stand-in, which overwrites its output
unless given ``--resume`` (its config command line lacks it). Before the first launch a decoy
neighbourhood is started (``tests.soak.decoys``).

Faults, from a plan drawn once from the seed (the same seed and length give the same faults in the
same order; the processes' timing does not change the plan):

- ``restart``: ``runwatch restart RUN --set K=V ... --yes`` with random values, some invalid (a
  typo in the flag name, a value the client rejects, a ``--set`` without ``=``);
- ``kill``: ``runwatch kill RUN --yes``, then ``runwatch launch RUN --yes`` a few seconds later;
- ``sshd-freeze``: SIGSTOP the sshd listener and its sessions for a few seconds, then SIGCONT;
- ``rotate-rename`` / ``rotate-copytruncate`` of the data file a run is writing;
- ``other-user-writer``: a process of another Unix user holds a dataset file open for writing for
  a while;
- ``decoy-churn``: one more look-alike decoy is started;
- ``escaping-fork`` / ``renamed`` / ``twin``: a kill and a launch, or a restart, of ``escape`` or
  ``daemon`` / ``renamed`` / one twin;
- ``oac-writer``: a shell ``>>`` loop or another user's open-append-close appender on ``local``'s
  data file, then a kill and a launch or a restart of ``local`` (to be refused), then the appender
  is retired and ``local`` launched;
- ``flag-resume``: a restart of ``sf`` with ``--set resume`` and a value it rejects at start (the
  rollback goes ahead), the same after archiving its output and launching it without ``--resume``
  (the rollback would overwrite: refused), or a restart with ``--unset resume``.
- ``metrics-drip`` / ``smi-hang``: for some seconds the local serving endpoint's ``/metrics``
  answers one byte a second, or ``nvidia-smi`` hangs, under the soak's ``runwatch watch``
  (``tests.soak.watcher``: it alerts all along to a working receiver, one that accepts and never
  answers and one on a closed port; its invariants ``watch-silent``, ``alert-late``,
  ``query-orphan`` and ``watcher-died`` are checked at the end).
- ``die`` / ``watcher-kill`` / ``finish`` / ``stop`` (``tests.soak.lifecycle``, on three more runs
  of the reference client: ``phoenix`` and ``finisher`` with ``on_exit = "restart"``, ``mortal``
  without): a client killed by a signal (a death), the same with the watcher SIGKILLed during the
  restart's backoff and started again, ``finisher`` ending at its own ``--token-budget``, and a
  ``runwatch kill`` from another terminal; their invariants ``death-unalerted``,
  ``false-run-died``, ``false-data-loss``, ``restart-policy`` and ``intent-dropped`` are checked
  at the end from the watchers' output, the working receiver and the audit log.

The soak stops at its minutes: the faults reached are a prefix of the plan.

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
  for ``STABLE_S``) within ``BOUND_S``, unless the action was a kill, it reported failure with
  the run's process untouched, it was refused while the soak's appender writes the run's data, or
  its rollback was refused because the previous command line lacked ``--resume``;
- ``escaped-writer``: once runwatch says it stopped a run (a kill exited 0, a restart got past its
  stop), no process of the stopped launch (its launch token, its cgroup) is alive, and after a kill
  the run's data files do not grow for ``ESCAPE_WATCH_S``;
- ``twin-signalled``: a twin catches a signal, or its process ends, only while runwatch acts on it;
- ``launched-beside-writer``: no run's process starts while an appender that is not a run appended
  to its data file all through the quiet window the gate watched before it (``BESIDE``);
- ``output-shrank``: no complete line of ``sf``'s output or sidecars is lost or changed, and the
  files are not replaced, except by the soak's own archiving.

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

from tests.soak import adversaries, lifecycle, procs
from tests.soak.decoys import Neighbourhood
from tests.soak.watcher import REFRESH_S, SoakWatcher

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "supervisor" / "demo" / "run_inference.py"
DATA_FILE = "raw_responses.jsonl"
SF_OUTPUT = "regen.jsonl"
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
    "restart": 24,
    "kill": 8,
    "sshd-freeze": 10,
    "rotate-rename": 6,
    "rotate-copytruncate": 6,
    "other-user-writer": 8,
    "decoy-churn": 6,
    "quiet": 6,
    "escaping-fork": 14,
    "renamed": 6,
    "twin": 10,
    "oac-writer": 8,
    "flag-resume": 10,
    "metrics-drip": 6,
    "smi-hang": 6,
    "die": 10,
    "watcher-kill": 6,
    "finish": 5,
    "stop": 6,
}
REFERENCE_RUNS = ("local", "remote")
"""The reference client's runs with a ledger, acted on by restarts, kills and rotations."""
FAULT_RUNS = {
    "sshd-freeze": ("remote",),
    "escaping-fork": ("escape", "daemon"),
    "renamed": ("renamed",),
    "twin": ("twin-a", "twin-b"),
    "oac-writer": ("local",),
    "flag-resume": ("sf",),
    "metrics-drip": ("local",),
    "smi-hang": ("local",),
    "die": ("phoenix", "mortal"),
    "watcher-kill": ("phoenix",),
    "finish": ("finisher",),
    "stop": ("phoenix", "mortal"),
}
"""The runs a fault kind acts on (any other kind: REFERENCE_RUNS); a kind none of whose runs the
soak has is planned as ``quiet``."""
SF_VARIANTS = ("archive-then-fail", "bad-value-with-resume", "without-resume")
"""``flag-resume``: archive the output, launch without ``--resume`` (``--reset``: the launch spec
keeps a ``--set resume``) and fail a restart (the rollback would overwrite); fail a restart given
``--resume``; restart with ``--unset resume``."""
SF_BAD_VALUE = "temperature=1.5"
"""A value the SpecForge stand-in rejects at start (after the restart's stop)."""
LIFECYCLE_RUNS = {
    "phoenix": ("P1", True),
    "mortal": ("M1", False),
    "finisher": ("F1", True),
}
"""The reference client's runs the lifecycle faults act on: dataset, ``on_exit = "restart"``."""
BACKOFF_S = 6.0
"""Their ``restart_backoff_seconds``."""
RESTART_WINDOW_S = 15.0
"""Their ``restart_window_seconds``: the soak kills ``phoenix`` only once its last restart is
older, so that every restart is the first of its window (backoff ``BACKOFF_S``)."""
FINISH_TOKENS = 3000
"""``finisher``'s ``--token-budget`` grows by this much at each launch: it ends by itself."""
FINISH_WAIT_S = 180.0
DIE_SIGNALS = ("SIGKILL", "SIGSEGV", "SIGABRT")


@dataclass
class Fault:
    slot: int
    kind: str
    run: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"#{self.slot} {self.kind} {self.run} {extra}".rstrip()


def make_plan(seed: int, slots: int, runs: list[str], only: list[str] | None = None) -> list[Fault]:
    """The faults of a soak, drawn from ``seed`` alone (of the kinds ``only``, when given)."""
    rng = random.Random(seed)
    kinds = [k for k in FAULT_WEIGHTS if only is None or k in only]
    weights = [FAULT_WEIGHTS[k] for k in kinds]
    plan = []
    for slot in range(slots):
        kind = rng.choices(kinds, weights)[0]
        eligible = [r for r in FAULT_RUNS.get(kind, REFERENCE_RUNS) if r in runs]
        if not eligible:
            kind, eligible = "quiet", runs
        run = rng.choice(eligible)
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
            params["seconds"] = round(rng.uniform(3.0, 12.0), 1)
        elif kind == "other-user-writer":
            params["seconds"] = round(rng.uniform(8.0, 30.0), 1)
        elif kind == "decoy-churn":
            params["decoy"] = rng.choice(["python-c-lookalike", "bash-c-wrapper", "tail-f"])
        elif kind in ("escaping-fork", "renamed", "twin"):
            params["action"] = rng.choice(["kill", "restart"])
            params["sets"] = [f"concurrency={rng.choice(['1', '2'])}"]
        elif kind == "oac-writer":
            params["writer"] = rng.choice(["oac-shell", "oac-other-user"])
            params["action"] = rng.choice(["kill", "restart"])
        elif kind == "flag-resume":
            params["variant"] = rng.choice(SF_VARIANTS)
        elif kind in ("metrics-drip", "smi-hang"):
            params["seconds"] = round(rng.uniform(5.0, 20.0), 1)
        elif kind in ("die", "watcher-kill"):
            params["signal"] = rng.choice(DIE_SIGNALS)
            if kind == "watcher-kill":
                params["down"] = round(rng.uniform(0.5, 3.0), 1)
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
    ledger_arg: str = ""
    """The ``--ledger`` value in its argv (relative for the twins, whose argv is the same)."""
    behaviour: str = "reference"
    """``reference``, one of ``adversaries.BEHAVIOURS``, or ``specforge``."""

    def data_file(self, dataset: str | None = None) -> Path:
        if self.behaviour == "specforge":
            return self.workdir / "out" / SF_OUTPUT
        return self.workdir / "out" / (dataset or self.datasets[0]) / DATA_FILE

    def output_files(self) -> list[Path]:
        """The files a flag-resume client must never lose a line of: its output and sidecars."""
        out = self.workdir / "out"
        return [out / SF_OUTPUT, out / "regen_error.jsonl", out / "regen_skipped.jsonl"]

    def processes(self) -> list[tuple[int, int, list[str]]]:
        """(pid, start ticks, argv) of the live processes of this run: its client, recognised
        by its own ledger argument and working directory (no decoy has both; a twin has the
        other's argv but not its workdir), or the SpecForge script in its workdir. An escaped
        writer (another argv) is not the run's client."""
        out = []
        marker = "regenerate_train_data.py" if self.behaviour == "specforge" else None
        ledger = self.ledger_arg or str(self.ledger)
        for pid in procs.pids():
            a = procs.argv(pid)
            if marker is not None:
                if not any(x.endswith(marker) for x in a):
                    continue
            elif "--ledger" not in a or ledger not in a:
                continue
            if procs.cwd(pid) != str(self.workdir):
                continue
            s = procs.stat(pid)
            if s is not None and s[0] != "Z":
                out.append((pid, s[1], a))
        return out

    def unit_members(
        self, config_ids: set[str], launch_ids: set[str] | None = None
    ) -> list[dict[str, Any]]:
        """Every live process of this run's launches (``launch_ids``, or any) by the soak's
        config (``config_ids``: another config may have a run of the same name): holding a
        launch token that names the run, or in a launch's cgroup; with what holds it."""
        found = []
        for pid in procs.pids():
            st = procs.stat(pid)
            if st is None or st[0] == "Z":
                continue
            why = []
            token = procs.launch_token(pid)
            if token is not None:
                parts = token.rsplit(":", 2)
                ours = len(parts) == 3 and parts[0] in config_ids and parts[1] == self.name
                if ours and (launch_ids is None or parts[2] in launch_ids):
                    why.append(f"token {token}")
            cg = procs.cgroup(pid) or ""
            if launch_ids and cg.rsplit("/", 1)[-1] in launch_ids and "/runwatch/" in cg:
                why.append(f"cgroup {cg}")
            if why:
                found.append(
                    {"pid": pid, "start_ticks": st[1], "argv": procs.argv(pid), "held": why}
                )
        return found

    def tokens(self) -> set[tuple[str, str]]:
        """(config id, launch id) of the launch tokens of the run's live processes."""
        ids = set()
        for pid, _, _ in self.processes():
            parts = (procs.launch_token(pid) or "").rsplit(":", 2)
            if len(parts) == 3 and parts[1] == self.name:
                ids.add((parts[0], parts[2]))
        return ids


@dataclass
class Action:
    """One runwatch command the soak ran."""

    label: str
    argv: list[str]
    started: float
    run: str | None = None
    """The run it acts on (launch, restart, kill)."""
    ended: float = 0.0
    rc: int | None = None
    output: str = ""
    stopped: list[dict[str, Any]] = field(default_factory=list)
    """The run's processes it ended (a kill or a restart): quiet ends (``tests.soak.lifecycle``)."""

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
    def __init__(
        self,
        root: Path,
        seed: int,
        minutes: float,
        interval: float,
        only: list[str] | None = None,
    ) -> None:
        self.only = only
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
        self.planned = 0
        self.archived: set[tuple[int, int]] = set()
        """(dev, inode) of flag-resume outputs the soak itself moved aside."""
        self.outputs: dict[str, tuple[int, int, int, str]] = {}
        """Per flag-resume file: (dev, inode, length, sha1) of the complete lines last seen."""
        self.twin_signals: dict[str, int] = {}
        self.twin_alive: dict[str, set[tuple[int, int]]] = {}
        self.seen_starts: set[tuple[int, int]] = set()
        self.escape_checks = 0
        self.watch = SoakWatcher(root)
        self.watch_figures: dict[str, Any] = {}
        self.config_ids: set[str] = set()
        """The config ids in the launch tokens of the soak's runs (runwatch derives one per
        config; another soak's runs have the same names)."""
        # The lifecycle faults' evidence (``tests.soak.lifecycle``).
        self.deaths: list[dict[str, Any]] = []
        self.quiet_ends: list[dict[str, Any]] = []
        """Processes that finished by themselves or were stopped through runwatch."""
        self.no_restart: list[dict[str, Any]] = []
        """Windows in which nothing may restart a run automatically."""
        self.watcher_kills: list[dict[str, Any]] = []
        self.finishes = 0
        self.lifecycle_figures: dict[str, Any] = {}

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
        scripts = {name: CLIENT for name in REFERENCE_RUNS}
        for name, behaviour, dataset in (
            ("escape", "escape", "E1"),
            ("daemon", "daemon", "D1"),
            ("renamed", "renamed", "N1"),
        ):
            workdir = self.root / f"work-{name}"
            write_prompts(workdir / "prompts", [dataset], prompts)
            (workdir / "ledger").mkdir(parents=True)
            ledger = workdir / "ledger" / "ledger.jsonl"
            self.runs[name] = Run(name, "here", workdir, [dataset], ledger, behaviour=behaviour)
            scripts[name] = adversaries.write_wrapper(self.root / "clients" / name, behaviour, REPO)
        # Twins: one script, the same argv (relative paths), two workdirs.
        twin_script = adversaries.write_wrapper(self.root / "clients" / "twin", "twin", REPO)
        for name in ("twin-a", "twin-b"):
            workdir = self.root / "twins" / name[-1] / "work"
            write_prompts(workdir / "prompts", ["T1"], prompts)
            (workdir / "ledger").mkdir(parents=True)
            self.runs[name] = Run(
                name, "here", workdir, ["T1"], workdir / "ledger" / "ledger.jsonl",
                ledger_arg="ledger/ledger.jsonl", behaviour="twin",
            )  # fmt: skip
            scripts[name] = twin_script
        for name, (dataset, _restart) in LIFECYCLE_RUNS.items():
            workdir = self.root / f"work-{name}"
            write_prompts(workdir / "prompts", [dataset], prompts)
            (workdir / "ledger").mkdir(parents=True)
            ledger = workdir / "ledger" / "ledger.jsonl"
            self.runs[name] = Run(name, "here", workdir, [dataset], ledger)
            scripts[name] = CLIENT
        sf_dir = self.root / "work-sf"
        adversaries.specforge_workdir(sf_dir, max(2000, int(self.minutes * 60 * 8)), REPO)
        self.runs["sf"] = Run("sf", "here", sf_dir, [SF_OUTPUT], sf_dir / "no-ledger",
                              behaviour="specforge")  # fmt: skip

        lines = [f"refresh_seconds = {REFRESH_S}", ""]
        lines += [
            '[[hosts]]\nname = "here"\nlocal = true',
            f"python = {json.dumps(sys.executable)}",
        ]
        lines.append(host_toml(ssh_cfg))
        for run in self.runs.values():
            if run.behaviour == "specforge":
                address = self.url.split("//", 1)[1].split("/", 1)[0]
                argv = [sys.executable, "scripts/regenerate_train_data.py", "--model", "soak"]
                argv += ["--server-address", address, "--input-file-path", "in.jsonl"]
                argv += ["--output-file-path", f"out/{SF_OUTPUT}", "--concurrency", "1"]
                argv += ["--max-tokens", "96"]
                extra = ["settle_seconds = 3.0"]
            else:
                concurrency = "2" if run.name in REFERENCE_RUNS else "1"
                argv = [
                    sys.executable,
                    str(scripts[run.name]),
                    "--datasets",
                    ",".join(run.datasets),
                ]
                argv += ["--prompts-dir", "prompts", "--output-dir", "out", "--api-base", self.url]
                argv += ["--model", "soak", "--concurrency", concurrency, "--max-tokens", "96"]
                argv += ["--report-seconds", "10", "--ledger", run.ledger_arg or str(run.ledger)]
                extra = ['output_dir = "out"']
                if run.name == "local":
                    extra.append('endpoint = "mock"')  # its /metrics is the watcher's fault
                if run.name == "finisher":
                    argv += ["--token-budget", str(FINISH_TOKENS)]
                if LIFECYCLE_RUNS.get(run.name, ("", False))[1]:
                    extra += ['on_exit = "restart"', f"restart_backoff_seconds = {BACKOFF_S}"]
                    extra += ["restart_max = 3", f"restart_window_seconds = {RESTART_WINDOW_S}"]
            lines += [
                "[[runs]]",
                f'name = "{run.name}"',
                f'host = "{run.host}"',
                f"workdir = {json.dumps(str(run.workdir))}",
                "argv = [" + ", ".join(json.dumps(a) for a in argv) + "]",
                *extra,
                f'log = "logs/{run.name}.log"',
                "stop_grace_seconds = 3.0",
                "",
            ]
        lines.append(self.watch.config_toml(self.url))
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
            if run.name == "finisher":
                continue  # launched by its faults: it ends by itself
            action = self.cli("launch (set-up)", "launch", run.name, "--yes")
            running = self.wait_running(run, BOUND_S)
            self.tokens_of(run)
            if action.rc != 0 or running is None:
                decoys = {d.pid: d.kind for d in self.hood.decoys}
                self.notes.append(
                    f"set-up: launch {run.name} exited {action.rc} and it is not running "
                    f"(decoys: {decoys}): {action.output.strip()[-600:]}"
                )
                print(f"note: {self.notes[-1]}", flush=True)
        self.watch.start(self.config, self.env, REPO)

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
        target = args[1] if len(args) > 1 and args[0] in ("launch", "restart", "kill") else None
        action = Action(label, argv, time.time(), run=target)
        with self.lock:
            self.history.append(action)
        stopping = args[0] in ("restart", "kill") and target in self.runs
        before = self.runs[target].processes() if stopping and target else []
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
        for pid, start, _ in before:
            if not procs.alive(pid, start):
                end = {"run": target, "pid": pid, "how": "stopped", "from": action.started,
                       "until": action.ended, "by": label}  # fmt: skip
                action.stopped.append(end)
                self.quiet_ends.append(end)
                self.no_restart.append(end)
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

    def tokens_of(self, run: Run) -> set[tuple[str, str]]:
        """The run's launch tokens now; their config ids are the soak's from then on."""
        tokens = run.tokens()
        self.config_ids.update(c for c, _ in tokens)
        return tokens

    def appender_on(self, run: Run) -> Any:
        """A live open-append-close decoy on one of the run's data files, or None."""
        files = {str(run.data_file(d)) for d in run.datasets}
        for d in self.hood.live():
            if d.appends is not None and d.note.get("appends_to") in files:
                return d
        return None

    def check_escapes(
        self,
        run: Run,
        action: Action,
        tokens: set[tuple[str, str]],
        before: list[tuple[int, int, list[str]]],
    ) -> None:
        """``escaped-writer``: once runwatch says a run is stopped (a kill that exited 0, a
        restart that got past its stop), nothing of the stopped launches is alive (a process
        with their launch token, or in their cgroup), and after a kill nothing appends to the
        run's files."""
        args = action.evidence()["argv"]
        kill = "kill" in args
        if kill:
            confirmed = action.rc == 0
        else:
            confirmed = action.rc == 0 or any(
                f"stopped at {s}" in action.output for s in STEPS_AFTER_STOP
            )
            confirmed = confirmed and not all(procs.alive(p, s) for p, s, _ in before)
        if not confirmed:
            return
        self.escape_checks += 1
        launch_ids = {lid for _, lid in tokens}
        left = run.unit_members(self.config_ids, None if kill else launch_ids)
        grew: dict[str, tuple[int, int]] = {}
        if kill and self.appender_on(run) is None:  # an appender's growth is the soak's own
            sizes = self._sizes(run)
            self.stop.wait(ESCAPE_WATCH_S)  # the observation window itself
            after = self._sizes(run)
            grew = {p: (sizes.get(p, 0), n) for p, n in after.items() if n > sizes.get(p, 0)}
        if not left and not grew:
            return
        what = []
        if left:
            what.append(f"{len(left)} process(es) of the stopped launch alive")
        if grew:
            what.append(f"{len(grew)} file(s) grew within {ESCAPE_WATCH_S:g} s")
        self.violations.add(
            "escaped-writer",
            f"{run.name}: after `{' '.join(args)}` exited {action.rc}: " + "; ".join(what),
            {
                "run": run.name,
                "launch_ids": sorted(launch_ids),
                "processes_before": [{"pid": p, "start_ticks": s, "argv": a} for p, s, a in before],
                "alive": left,
                "grew": grew,
                "runwatch": action.evidence(),
            },
        )

    def _sizes(self, run: Run) -> dict[str, int]:
        """The sizes of the run's own data files (a decoy client in its workdir writes others)."""
        out: dict[str, int] = {}
        paths = run.output_files() if run.behaviour == "specforge" else []
        paths += [run.data_file(d) for d in run.datasets if run.behaviour != "specforge"]
        for path in paths:
            with contextlib.suppress(OSError):
                out[str(path)] = path.stat().st_size
        return out

    def check_left_down(
        self, run: Run, action: Action, before: list[tuple[int, int, list[str]]]
    ) -> None:
        """``run-left-down``: after ``action``, the run is running within the bound, unless the
        action reported failure and left the run's processes as they were."""
        untouched = all(procs.alive(pid, start) for pid, start, _ in before)
        if action.rc not in (0, None) and untouched:
            return  # reported failure, and stopped nothing (or the run was down already)
        if action.rc not in (0, None) and self.appender_on(run) is not None:
            return  # a writer that is not a run appends to its data: it must stay down
        if (
            "ROLLBACK REFUSED" in action.output
            and before
            and all("--resume" not in a for _, _, a in before)
        ):
            return  # the previous command line would overwrite: stopped, never traded for data
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
        resume = ["--set", "resume"] if run.behaviour == "specforge" else []
        action = self.cli("launch (recovery)", "launch", run.name, *resume, "--yes")
        if action.rc != 0 and "stopped at fingerprint" in action.output:
            # The config's argv differs from the last launch (a restart's --set is not kept)
            # and launch has no --allow-change: what an operator can do is a restart.
            action = self.cli(
                "restart (recovery, --allow-change sampling)",
                *("restart", run.name, *resume, "--allow-change", "sampling", "--yes"),
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
            ids = self.tokens_of(run)
            action = self.cli(label, "restart", run.name, *args, "--yes")
            self.check_escapes(run, action, ids, before)
            self.check_left_down(run, action, before)
        elif f.kind == "kill":
            ids, before = self.tokens_of(run), run.processes()
            action = self.cli("kill", "kill", run.name, "--yes", "--grace", "3")
            self.check_escapes(run, action, ids, before)
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
        elif f.kind in ("metrics-drip", "smi-hang"):
            self.watch.fault(f.kind, f.params["seconds"])
        elif f.kind in ("die", "watcher-kill"):
            self.die(run, f, label)
        elif f.kind == "finish":
            self.finish(run, label)
        elif f.kind == "stop":
            self.stop_from_terminal(run, label)
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
        elif f.kind in ("escaping-fork", "renamed", "twin"):
            self.kill_or_restart(run, f, label)
        elif f.kind == "oac-writer":
            self.beside_appender(run, f)
        elif f.kind == "flag-resume":
            self.flag_resume(run, f)
        elif f.kind == "decoy-churn":
            local = self.runs["local"]
            kind = f.params["decoy"]
            if kind == "python-c-lookalike":
                self.hood.python_lookalike(run.workdir, ",".join(run.datasets))
            elif kind == "bash-c-wrapper":
                self.hood.bash_wrapper(run.workdir, ",".join(run.datasets))
            else:
                self.hood.tail_follower(local.workdir, Path("out") / local.datasets[0] / DATA_FILE)

    def kill_or_restart(self, run: Run, f: Fault, label: str) -> None:
        """A kill and a launch, or a restart, of a run whose process escapes, renames itself or
        has a twin; ``escaped-writer`` is checked once runwatch says it stopped it."""
        ids, before = self.tokens_of(run), run.processes()
        if f.params["action"] == "kill":
            action = self.cli(f"{label}: kill", "kill", run.name, "--yes", "--grace", "3")
            self.check_escapes(run, action, ids, before)
            before = run.processes()
            action = self.cli(f"{label}: launch after kill", "launch", run.name, "--yes")
        else:
            args = [a for s in f.params["sets"] for a in ("--set", s)]
            action = self.cli(f"{label}: restart", "restart", run.name, *args, "--yes")
            self.check_escapes(run, action, ids, before)
        self.check_left_down(run, action, before)

    def beside_appender(self, run: Run, f: Fault) -> None:
        """An appender that is not a run (a shell ``>>`` loop, another user's open-append-close
        writer) on the run's data file, then a kill and launch or a restart of the run: every
        start must be refused while it appends (``launched-beside-writer`` is the checker's).
        Then the appender is retired and the run launched again."""
        path = run.data_file()
        kind = f.params["writer"]
        if not path.exists() or (kind == "oac-other-user" and self.other_user is None):
            self.skip("oac-writer", f"{f.describe()}: {path} missing or no other user")
            return
        decoy = self.hood.appender(kind, path, self.other_user)
        self.faults[f"oac-writer {kind}"] += 1
        try:
            wait_for(lambda: len(self.hood.append_times(decoy)) >= 3, 15.0)
            if f.params["action"] == "kill":
                ids, before = self.tokens_of(run), run.processes()
                action = self.cli("oac-writer: kill", "kill", run.name, "--yes", "--grace", "3")
                self.check_escapes(run, action, ids, before)
                action = self.cli("oac-writer: launch beside it", "launch", run.name, "--yes")
            else:
                ids, before = self.tokens_of(run), run.processes()
                action = self.cli("oac-writer: restart beside it", "restart", run.name, "--yes")
                self.check_escapes(run, action, ids, before)
            if action.rc == 0:
                self.notes.append(f"oac-writer: a start of {run.name} beside {kind} exited 0")
        finally:
            decoy.retire()
        self.recover(run)

    def flag_resume(self, run: Run, f: Fault) -> None:
        """The SpecForge stand-in (overwrites its output unless given ``--resume``) under
        restarts whose relaunch fails; ``output-shrank`` is the checker's."""
        variant = f.params["variant"]
        self.faults[f"flag-resume {variant}"] += 1
        if variant == "archive-then-fail":
            # The operator archives the output: a launch without --resume is then fine (there
            # is nothing to overwrite), and the rollback of a failed restart would overwrite
            # what it has written since.
            self.cli("flag-resume: kill", "kill", run.name, "--yes", "--grace", "3")
            archive = run.workdir / f"archive-{f.slot}"
            archive.mkdir()
            for path in run.output_files():
                if path.exists():
                    st = path.stat()
                    self.archived.add((st.st_dev, st.st_ino))
                    t = time.time()
                    os.rename(path, archive / path.name)
                    self.rotations.append({"kind": "archive", "path": str(path), "t_start": t,
                                           "t_end": time.time(), "ino": st.st_ino})  # fmt: skip
            # --reset: without the launch spec a --set resume left, the config's command line.
            action = self.cli(
                "flag-resume: launch on no data", "launch", run.name, "--reset", "--yes"
            )
            if action.rc != 0:
                self.notes.append(f"flag-resume: launch on no data exited {action.rc}")
                self.recover(run)
                return
            wait_for(lambda: _lines(run.data_file()) >= 3, 60.0)
        if variant == "without-resume":
            sets = ["--unset", "resume", "--set", "concurrency=2"]
        else:
            sets = ["--set", "resume", "--set", SF_BAD_VALUE, "--allow-change", "temperature"]
        before = run.processes()
        action = self.cli(f"flag-resume: restart ({variant})", "restart", run.name, *sets, "--yes")
        self.check_left_down(run, action, before)
        if "ROLLBACK REFUSED" in action.output:
            self.faults["flag-resume rollback refused"] += 1
        if not run.processes():
            self.recover(run)

    # ------------------------------------------------------------------ lifecycle faults

    def intent_file(self, run: Run) -> Path | None:
        """The restart intent the watcher keeps for ``run`` (``supervisor.intents``), if any."""
        found = sorted((self.root / "state" / "runwatch" / "intents").glob(f"*/{run.name}.json"))
        return found[0] if found else None

    def die(self, run: Run, f: Fault, label: str) -> None:
        """Kill the run's client with a signal (a death: datasets not done). With ``on_exit =
        "restart"`` the watcher must restart it after its backoff (the soak waits for it); else
        nothing restarts it and the soak launches it again after the backoff and 3 refreshes.
        ``watcher-kill``: once the watcher has written the restart intent and shown the death,
        the watcher is SIGKILLed and started again; the new one must take the intent over."""
        restart = LIFECYCLE_RUNS[run.name][1]
        live = self.wait_running(run, BOUND_S)
        if live is None:
            self.skip(label, f"{f.describe()}: {run.name} not running")
            return
        if restart:
            # Every restart the first of its window: the last one (about when this process
            # started) must be older than the window.
            age = time.time() - procs.start_wall(live[1])
            self._pause(max(0.0, RESTART_WINDOW_S + 2.0 - age))
            if not procs.alive(live[0], live[1]):
                self.skip(label, f"{f.describe()}: {run.name} pid {live[0]} ended meanwhile")
                return
        pid = live[0]
        old_intent = self.intent_file(run)
        if old_intent is not None:
            self.notes.append(f"{run.name}: an intent was left before the death: {old_intent}")
        sig = signal.Signals[f.params["signal"]]
        os.kill(pid, sig)
        death = {"run": run.name, "pid": pid, "time": time.time(), "signal": sig.name,
                 "restart": restart, "backoff": BACKOFF_S, "watcher_killed": False}  # fmt: skip
        for d in self.deaths:
            if d["run"] == run.name and d.get("next") is None:
                d["next"] = death["time"]
        self.deaths.append(death)
        if not restart:
            self._pause(BACKOFF_S + 3 * REFRESH_S)  # the window in which nothing may restart it
            window = {"run": run.name, "pid": pid, "how": "died (on_exit = alert)",
                      "from": death["time"], "until": time.time()}  # fmt: skip
            self.no_restart.append(window)
            self.recover(run)
            return
        if f.kind == "watcher-kill" and not self.kill_watcher_in_backoff(run, death, f):
            self.faults[label] -= 1
            self.faults[f"{label} (no backoff seen: a plain death)"] += 1
        bound = BACKOFF_S + lifecycle.RESTART_BOUND_S + 2 * REFRESH_S
        if death["watcher_killed"]:
            bound += f.params["down"] + lifecycle.INTENT_BOUND_S
        if not wait_for(lambda: any(p != pid for p, _, _ in run.processes()), bound):
            self.notes.append(f"{run.name}: not running again {bound:g} s after its death")
            self.recover(run)

    def kill_watcher_in_backoff(self, run: Run, death: dict[str, Any], f: Fault) -> bool:
        """SIGKILL the watcher once it has written ``run``'s restart intent and shown its death
        (a refresh line after the event: the alert is spooled), while the backoff runs; start a
        new watcher. False when no backoff was seen (the death is then an ordinary one)."""
        gen = self.watch.gens[-1]
        pid = death["pid"]

        def in_backoff() -> bool:
            if self.intent_file(run) is None:
                return False
            lines = gen.lines()
            ours = [
                i
                for i, e in enumerate(lines)
                if e.get("kind") == "run-died"
                and e.get("run") == run.name
                and lifecycle.died_pid(e) == pid
            ]
            at = ours[0] if ours else None
            return at is not None and any("tick" in e for e in lines[at:])

        if not wait_for(in_backoff, 6 * REFRESH_S + 20.0):
            self.notes.append(f"watcher-kill: no intent and run-died of {run.name} pid {pid} seen")
            return False
        path = self.intent_file(run)
        try:
            intent = json.loads(path.read_bytes()) if path is not None else {}
        except (OSError, ValueError):
            intent = {}
        if not intent or time.time() >= float(intent.get("not_before") or 0):
            self.notes.append(f"watcher-kill: {run.name}'s backoff was over before the kill")
            return False
        killed = self.watch.kill()
        self._pause(f.params["down"])  # the watcher stays down a moment, as after a crash
        new = self.watch.start()
        death["watcher_killed"] = True
        self.watcher_kills.append({"run": run.name, "pid": pid, "intent": intent, "killed": killed,
                                   "restarted": new.started, "new_pid": new.proc.pid,
                                   "old_pid": gen.proc.pid})  # fmt: skip
        return True

    def finish(self, run: Run, label: str) -> None:
        """Launch ``finisher`` with a ``--token-budget`` above what it holds and let it end by
        itself (exit 0, "all datasets done"): nothing may call it dead or restart it until the
        soak's next launch."""
        if run.processes():
            self.skip(label, f"finish: {run.name} still running")
            return
        self.finishes += 1
        budget = self.finishes * FINISH_TOKENS
        action = self.cli("finish: launch", "launch", run.name, "--set",
                          f"token-budget={budget}", "--yes")  # fmt: skip
        for w in self.no_restart:
            if w["run"] == run.name and w["until"] is None:
                w["until"] = action.started
        live = run.processes()
        if action.rc != 0 or not live:
            self.notes.append(f"finish: launch {run.name} exited {action.rc}, running {live}")
            return
        pid, start, _ = live[0]
        if not wait_for(lambda: not procs.alive(pid, start), FINISH_WAIT_S):
            self.notes.append(
                f"finish: {run.name} pid {pid} still running after {FINISH_WAIT_S:g} s"
            )
            return
        log = run.workdir / "logs" / f"{run.name}.log"
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        if f"pid {pid}:" in tail and "all datasets done" not in tail.split(f"pid {pid}:", 1)[1]:
            self.notes.append(f"finish: {run.name} pid {pid} ended without 'all datasets done'")
            return
        end = {"run": run.name, "pid": pid, "how": "finished", "from": time.time(), "until": None}
        self.quiet_ends.append(end)
        self.no_restart.append(end)

    def stop_from_terminal(self, run: Run, label: str) -> None:
        """``runwatch kill`` from another terminal (the soak's CLI) on a run the watcher
        watches: a stop, not a death; after the backoff and 3 refreshes it is launched again."""
        if self.wait_running(run, BOUND_S) is None:
            self.skip(label, f"stop: {run.name} not running")
            return
        action = self.cli("stop: kill", "kill", run.name, "--yes", "--grace", "3")
        if action.rc != 0:
            self.notes.append(f"stop: kill {run.name} exited {action.rc}")
        self._pause(BACKOFF_S + 3 * REFRESH_S)  # the window in which nothing may restart it
        for end in action.stopped:
            end["until"] = time.time()
        self.recover(run)

    def check_lifecycle(self) -> None:
        """The lifecycle invariants (``tests.soak.lifecycle``) and their figures."""
        from supervisor import audit

        records = audit.read(path=self.root / "state" / "runwatch" / audit.AUDIT_NAME)
        events = [e for e in self.watch.lines() if "kind" in e]
        received = list(zip(list(self.watch.receiver.times), self.watch.receiver.messages(),
                            strict=False))  # fmt: skip
        add = self.violations.add
        for w in self.no_restart:
            if w["until"] is None:
                w["until"] = time.time()
        ticks = [float(e["time"]) for e in self.watch.lines() if "tick" in e]
        latencies = lifecycle.check_deaths_alerted(self.deaths, received, ticks, REFRESH_S, add)
        other = lifecycle.check_run_died(events, self.deaths, self.quiet_ends, add)
        explained = lifecycle.check_data_loss(events, records, self.rotations, add)
        restarts = lifecycle.auto_restarts(records)
        delays = lifecycle.check_restart_policy(self.deaths, self.no_restart, restarts, add)
        taken = lifecycle.check_intents(self.watcher_kills, restarts, events, add)
        lat = sorted(latencies)
        self.lifecycle_figures = {
            "deaths caused (restart policy)": f"{len(self.deaths)} "
            f"({sum(d['restart'] for d in self.deaths)})",
            "death -> alert s (median, max)": f"{lat[len(lat) // 2]:.2f}, {lat[-1]:.2f}"
            if lat
            else "-",
            f"deaths alerted after over 2 x {REFRESH_S:g} s": sum(x > 2 * REFRESH_S for x in lat),
            "death -> restart s (max)": f"{max(delays):.1f}" if delays else "-",
            "finished by themselves": sum(q["how"] == "finished" for q in self.quiet_ends),
            "stopped through runwatch": sum(q["how"] == "stopped" for q in self.quiet_ends),
            "watcher SIGKILLs in a backoff (intents carried out)": f"{len(self.watcher_kills)} "
            f"({taken})",
            "automatic restarts (audit)": len(restarts),
            "data-loss alarms from the soak's own changes": explained,
            "run-died the soak did not cause": len(other),
        }
        for ev in other:
            self.notes.append(f"run-died the soak did not cause: {ev.get('message')}")

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
                self.check_twins()
                self.check_outputs()
                self.check_beside_appenders()
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
                continue  # type: ignore[unreachable]  # mypy keeps the narrowing of the first read
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

    def acting_on(self, run: str, t: float, margin: float = 2.0) -> list[Action]:
        """The runwatch commands on ``run`` running at ``t`` (give or take ``margin``)."""
        with self.lock:
            return [
                a
                for a in self.history
                if a.run == run
                and a.started - margin <= t
                and (a.ended == 0.0 or t <= a.ended + margin)
            ]

    def check_twins(self) -> None:
        """``twin-signalled``: a twin catches a signal, or its process ends, only while runwatch
        acts on that twin (never while it acts on the other one)."""
        for run in self.runs.values():
            if run.behaviour != "twin":
                continue
            got = adversaries.signals_of(run.workdir / "signals.log")
            for t, pid, name in got[self.twin_signals.get(run.name, 0) :]:
                if not self.acting_on(run.name, t):
                    self.violations.add(
                        "twin-signalled",
                        f"{run.name} pid {pid} caught {name} with no runwatch command on it",
                        {"run": run.name, "pid": pid, "signal": name, "time": t,
                         "runwatch": self.recent_actions(t - 30)},
                        key=(run.name, pid, t),
                    )  # fmt: skip
            self.twin_signals[run.name] = len(got)
            now = {(p, st) for p, st, _ in run.processes()}
            for pid, start in self.twin_alive.get(run.name, set()) - now:
                if not self.acting_on(run.name, time.time()):
                    self.violations.add(
                        "twin-signalled",
                        f"{run.name} pid {pid} ended with no runwatch command on it",
                        {"run": run.name, "pid": pid, "start_ticks": start,
                         "runwatch": self.recent_actions(time.time() - 30)},
                        key=(run.name, pid, start),
                    )  # fmt: skip
            self.twin_alive[run.name] = now

    def check_outputs(self) -> None:
        """``output-shrank``: a flag-resume client's files only grow: every complete line seen
        in one stays, at its place, unless the soak itself moved the file aside."""
        for run in self.runs.values():
            if run.behaviour != "specforge":
                continue
            for path in run.output_files():
                try:
                    with open(path, "rb") as f:
                        st = os.fstat(f.fileno())
                        data = f.read()
                except FileNotFoundError:
                    continue
                data = data[: data.rfind(b"\n") + 1]
                key = str(path)
                old = self.outputs.get(key)
                self.outputs[key] = (
                    st.st_dev,
                    st.st_ino,
                    len(data),
                    hashlib.sha1(data).hexdigest(),
                )
                if old is None:
                    continue
                dev, ino, length, sha = old
                if (dev, ino) != (st.st_dev, st.st_ino):
                    if (dev, ino) in self.archived:
                        continue
                    why = f"replaced (inode {ino} -> {st.st_ino})"
                elif len(data) < length:
                    why = f"shrank from {length} to {len(data)} bytes"
                elif hashlib.sha1(data[:length]).hexdigest() != sha:
                    why = f"its first {length} bytes changed"
                else:
                    continue
                self.violations.add(
                    "output-shrank",
                    f"{run.name}: {path.name} {why}",
                    {"file": key, "before": {"ino": ino, "bytes": length, "sha1": sha},
                     "now": {"ino": st.st_ino, "bytes": len(data)},
                     "runwatch": self.recent_actions(time.time() - 60)},
                    key=(key, st.st_ino, length),
                )  # fmt: skip

    def check_beside_appenders(self) -> None:
        """``launched-beside-writer``: no process of a run starts while an appender that is not
        a run writes its data file (appends all through the quiet window before the start)."""
        appenders = [d for d in self.hood.decoys if d.appends is not None]
        if not appenders:
            return
        for run in self.runs.values():
            files = {str(run.data_file(ds)) for ds in run.datasets}
            for pid, start, argv in run.processes():
                if (pid, start) in self.seen_starts:
                    continue
                self.seen_starts.add((pid, start))
                t = procs.start_wall(start)
                for d in appenders:
                    if d.note.get("appends_to") not in files:
                        continue
                    during = [
                        a for a in self.hood.append_times(d) if t - BESIDE[0] <= a <= t - BESIDE[1]
                    ]
                    if len(during) < 2:
                        continue
                    self.violations.add(
                        "launched-beside-writer",
                        f"{run.name} pid {pid} started while {d.kind} pid {d.pid} appended to "
                        f"{d.note['appends_to']} ({len(during)} appends 2 to 1 s before)",
                        {"run": run.name, "pid": pid, "start": round(t, 3), "argv": argv,
                         "appender": d.evidence(), "appends": during,
                         "runwatch": self.recent_actions(t - 30)},
                        key=(pid, start, d.pid),
                    )  # fmt: skip

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
        slots = max(1, int(self.minutes * 60 / self.interval))
        plan = make_plan(self.seed, slots, list(self.runs), self.only)
        print(f"soak: seed {self.seed}, {len(plan)} faults planned over {self.minutes:g} min "
              f"(replay: --seed {self.seed} --minutes {self.minutes:g}); dir {self.root}",
              flush=True)  # fmt: skip
        checker = threading.Thread(target=self.checker, name="checker", daemon=True)
        checker.start()
        t0 = time.monotonic()
        deadline = t0 + self.minutes * 60
        for i, f in enumerate(plan):
            if time.monotonic() >= deadline:
                break  # faults outlast their slots: the soak's length is its minutes
            self.planned = i + 1
            next_at = t0 + i * self.interval
            self._pause(max(0.0, next_at - time.monotonic()))  # the soak's pacing
            for run in self.runs.values():
                if run.name != "finisher" and not run.processes():
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
        self.watch.stop()
        self.watch_figures = self.watch.check(self.violations.add)
        self.check_lifecycle()
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
              f"--minutes {self.minutes:g} --interval {self.interval:g}"
              + (f" --faults {','.join(self.only)}" if self.only else ""))  # fmt: skip
        print(
            f"ran {self.elapsed / 60:.1f} min ({self.interval:g} s between planned faults); "
            f"{self.planned} faults reached; {self.escape_checks} stops checked for escapes"
        )
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
        print("watcher:")
        for k, v in self.watch_figures.items():
            print(f"  {k:<40} {v}")
        print("lifecycle:")
        for k, v in self.lifecycle_figures.items():
            print(f"  {k:<52} {v}")
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
            self.tokens_of(run)
        for run in self.runs.values():
            for pid, _start, _ in run.processes():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
            # What a run left in other sessions (the daemon's writer) carries its token.
            for m in run.unit_members(self.config_ids):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(m["pid"], signal.SIGKILL)
        self.watch.close()
        self.hood.close()
        if self.server is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait(10)
        if self.pool is not None:
            self.pool.close()


def wait_for(condition: Any, timeout: float) -> bool:
    """Poll ``condition`` until true (True) or ``timeout`` seconds (False): the soak goes on
    either way."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)  # polling interval of a condition wait
    return True


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


STEPS_AFTER_STOP = ("gpu-release", "quiet", "data-repair", "launch")
"""A restart that stopped at one of these had its stop confirmed."""
ESCAPE_WATCH_S = 2.0
"""How long the run's files are watched for growth after runwatch says it stopped the run: the
escaped writers append every 0.3 s."""
BESIDE = (2.0, 1.0)
"""``launched-beside-writer``: an appender's appends between 2.0 and 1.0 s before a run's process
started fall in every quiet window the gate could have watched (at least 2 s, ending at most
1 s before the launch)."""


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
    p.add_argument("--faults", default=None, help="only these fault kinds (comma-separated)")
    args = p.parse_args(argv)
    only = args.faults.split(",") if args.faults else None
    if only and set(only) - set(FAULT_WEIGHTS):
        p.error(f"unknown fault kinds {sorted(set(only) - set(FAULT_WEIGHTS))}: "
                f"choose among {', '.join(FAULT_WEIGHTS)}")  # fmt: skip
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    root = Path(args.dir or tempfile.mkdtemp(prefix="runwatch-soak-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    soak = Soak(root, seed, args.minutes, args.interval, only)
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
