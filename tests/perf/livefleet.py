"""The live fleet the steady-state benchmarks watch, and how they measure a process.

8 runs of 4 datasets on this machine: each run is a stand-in client (:data:`CLIENT`) that appends
one record of 50..300 tokens to each of its datasets every second, after :data:`SEED_RECORDS`
written up front. :func:`make_fleet` writes the datasets, the client and the config;
:func:`usage` measures CPU and RSS of processes over the same seconds; :func:`growth_per_hour`
fits the RSS trend. Used by ``bench_tui.py`` (the dashboard) and ``bench_watch.py`` (the watcher).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import psutil

RUNS = 8
PER_RUN = 4
SEED_RECORDS = 300
CLIENT_NAME = "bench_fleet_client.py"
"""The stand-in client's script, the config's only script: the runs of others on a shared machine
(``run_inference.py`` of their tests) are then not listed by the front end under test."""
CLIENT = """\
import json, os, random, sys, time
args = sys.argv[1:]
datasets = args[args.index("--datasets") + 1].split(",")
out = args[args.index("--output-dir") + 1]
rng = random.Random(os.getpid())
files = []
for d in datasets:
    os.makedirs(os.path.join(out, d), exist_ok=True)
    files.append(open(os.path.join(out, d, "raw_responses.jsonl"), "ab", buffering=0))
i = 0
while True:
    for f in files:
        n = rng.randint(50, 300)
        rec = {"sample_id": "s%d-%d" % (os.getpid(), i),
               "output_ids": [rng.randrange(163840) for _ in range(n)],
               "prompt_tokens": 100, "completion_tokens": n, "finish_reason": "stop"}
        f.write((json.dumps(rec) + "\\n").encode())
    i += 1
    time.sleep(1.0)  # the client's pace: one response per dataset per second
"""


ISOLATED_ENV = "RUNWATCH_BENCH_ISOLATED"
UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
REAPER = ["bash", "-c", '"$@" & wait $!', "reaper"]
"""PID 1 of the namespace: bash reaps every process orphaned in it (as init does outside), and
exits with the benchmark's status."""


def isolate() -> str:
    """Run this benchmark again in a PID namespace of its own (root, ``unshare``), so that it
    lists only the processes it started: the long mode's strangers are the ones it churns, not
    whatever else the machine runs (a test suite's clients, another benchmark's fleet), which
    would make its memory a measure of its neighbours. Returns how the benchmark runs, to print;
    returns only in the benchmark's final process."""
    if os.environ.get(ISOLATED_ENV):
        return "isolated: a PID namespace of its own (only its own processes are listed)"
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "NOT isolated (needs root and unshare): the machine's other clients are listed too"
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip() or f"exit {probe.returncode}"
        return f"NOT isolated (unshare: {why}): the machine's other clients are listed too"
    os.environ[ISOLATED_ENV] = "1"
    sys.stdout.flush()
    os.execvp(UNSHARE[0], [*UNSHARE, *REAPER, sys.executable, *sys.argv])


def end_on_sigterm() -> None:
    """A SIGTERM (``timeout``, a cancelled CI job) ends the benchmark through its ``finally``
    blocks: the clients it started, in sessions of their own, must not outlive it (they would be
    listed as runs by the next benchmark of the same fleet)."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def datasets_of(run: int) -> list[str]:
    return [f"B{run}{k}" for k in range(1, PER_RUN + 1)]


def make_fleet(base: Path, refresh_seconds: float | None) -> tuple[Path, list[list[str]]]:
    """The work dir with seeded datasets and the client, and the config (``refresh_seconds``:
    None leaves the config's default); (config, client argvs)."""
    work = base / "work"
    work.mkdir()
    (work / CLIENT_NAME).write_text(CLIENT)
    rng = random.Random(7)
    lines = [] if refresh_seconds is None else [f"refresh_seconds = {refresh_seconds}"]
    lines += [
        f'scripts = ["{CLIENT_NAME}"]',
        "[[hosts]]",
        'name = "bench"',
        "local = true",
        f"python = {json.dumps(sys.executable)}",
    ]
    argvs = []
    for r in range(1, RUNS + 1):
        out = f"out{r}"
        for ds in datasets_of(r):
            d = work / out / ds
            d.mkdir(parents=True)
            with (d / "raw_responses.jsonl").open("w") as f:
                for i in range(SEED_RECORDS):
                    n = rng.randint(50, 300)
                    rec = {
                        "sample_id": f"seed-{i}",
                        "output_ids": [rng.randrange(163_840) for _ in range(n)],
                        "prompt_tokens": 100,
                        "completion_tokens": n,
                        "finish_reason": "stop",
                    }
                    f.write(json.dumps(rec) + "\n")
        argv = [sys.executable, CLIENT_NAME, "--datasets", ",".join(datasets_of(r))]
        argv += ["--output-dir", out, "--max-samples", "7000"]
        argvs.append(argv)
        lines += [
            "[[runs]]",
            f'name = "run{r}"',
            'host = "bench"',
            f"workdir = {json.dumps(str(work))}",
            f"argv = {json.dumps(argv)}",
            f'output_dir = "{out}"',
        ]
    for r in range(1, RUNS + 1):
        for ds in datasets_of(r):
            lines += [f"[datasets.{ds}]", "token_budget = 10000000", "max_samples = 7000"]
    config = base / "runwatch.toml"
    config.write_text("\n".join(lines) + "\n")
    return config, argvs


class Usage(NamedTuple):
    """What one process used while watched."""

    cpu: float
    """CPU (user + system) as % of one core."""
    samples: list[tuple[float, float]]
    """RSS (seconds since the start, MB), sampled every second."""
    kids: dict[int, float]
    """CPU % of one core of each child process (by pid) apart."""


ARENA = 64 * 2**20
"""glibc malloc's per-thread heaps are mapped at multiples of 64 MiB."""


def memory_detail(proc: psutil.Process) -> str:
    """Where ``proc``'s resident memory is, in kB, from ``/proc/PID/smaps``: threads, then the
    main malloc heap, the other threads' malloc heaps, 1 MiB anonymous mappings (Python's object
    arenas), 8 MiB ones (thread stacks), other anonymous memory, and file-backed memory. Written
    beside the long benchmarks' samples, so that a step in RSS can be put down to its kind."""
    kinds = dict.fromkeys(("heap", "arenas", "py", "stacks", "anon", "file"), 0)
    try:
        threads = proc.num_threads()
        text = Path(f"/proc/{proc.pid}/smaps").read_text()
    except (OSError, psutil.Error):
        return "gone"
    kind = "anon"
    for line in text.splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            name = head[5] if len(head) > 5 else ""
            size = end - start
            if name == "[heap]":
                kind = "heap"
            elif name.startswith("/"):
                kind = "file"
            elif name:
                kind = "anon"
            elif start % ARENA == 0 and size <= ARENA:
                kind = "arenas"
            elif size == 2**20:
                kind = "py"
            elif size == 8 * 2**20:
                kind = "stacks"
            else:
                kind = "anon"
        elif head[0] == "Rss:":
            kinds[kind] += int(head[1])
    return f"threads={threads} " + " ".join(f"{k}={v}" for k, v in kinds.items())


def usage(procs: list[psutil.Process], seconds: float, log: Path | None = None) -> list[Usage]:
    """What each of ``procs`` used over the same ``seconds`` (a burst of load on the machine hits
    them alike); with ``log``, each sample is also appended there as it is taken (seconds, then
    each process's RSS in MB), so that a long watch can be followed."""
    kids = [{c.pid: c for c in p.children(recursive=True)} for p in procs]
    c0 = [p.cpu_times() for p in procs]
    k0 = [{pid: sum(c.cpu_times()[:2]) for pid, c in ks.items()} for ks in kids]
    t0 = time.perf_counter()
    samples = [[(0.0, p.memory_info().rss / 2**20)] for p in procs]
    end = t0 + seconds
    while time.perf_counter() < end:
        time.sleep(min(1.0, max(0.0, end - time.perf_counter())))  # the sampling period
        now = time.perf_counter() - t0
        for p, s in zip(procs, samples, strict=True):
            s.append((now, p.memory_info().rss / 2**20))
        if log is not None:
            with log.open("a") as f:
                f.write(f"{now:.1f} " + " ".join(f"{s[-1][1]:.2f}" for s in samples) + "\n")
            if len(samples[0]) % 10 == 1:
                with log.with_name(log.name + ".detail").open("a") as f:
                    for k, p in enumerate(procs):
                        f.write(f"{now:.1f} {k} {memory_detail(p)}\n")
    wall = time.perf_counter() - t0
    out = []
    for p, first, ks, ks0, s in zip(procs, c0, kids, k0, samples, strict=True):
        last = p.cpu_times()
        cpu = 100 * ((last.user - first.user) + (last.system - first.system)) / wall
        kid_cpu = {}
        for pid, c in ks.items():
            try:
                kid_cpu[pid] = 100 * (sum(c.cpu_times()[:2]) - ks0[pid]) / wall
            except psutil.Error:
                continue
        out.append(Usage(cpu, s, kid_cpu))
    return out


def steady(
    proc: psutil.Process, seconds: float
) -> tuple[float, list[tuple[float, float]], dict[int, float]]:
    """CPU % of one core of ``proc`` over ``seconds``, its RSS (s, MB) sampled every second, and
    its children's CPU % apart."""
    return tuple(usage([proc], seconds)[0])  # type: ignore[return-value]


WARMUP_S = 660.0
"""RSS grows while the rate windows fill (10 minutes of samples); growth is judged after."""


LONG_WARMUP_S = 600.0
"""The long mode's warm-up: its slope is fitted over the samples after the first 10 minutes."""


def growth_per_hour(samples: list[tuple[float, float]], warmup: float = WARMUP_S) -> float | None:
    """MB per hour: the least-squares slope of RSS over the samples after ``warmup`` seconds
    (None when the watch was too short to tell)."""
    tail = [s for s in samples if s[0] >= warmup]
    if not tail or tail[-1][0] - tail[0][0] < 120:
        return None
    mt = sum(t for t, _ in tail) / len(tail)
    mr = sum(r for _, r in tail) / len(tail)
    var = sum((t - mt) ** 2 for t, _ in tail)
    return 3600 * sum((t - mt) * (r - mr) for t, r in tail) / var if var else 0.0


def rss_at(samples: list[tuple[float, float]], at: float) -> float:
    """The RSS (MB) of the sample nearest to ``at`` seconds."""
    return min(samples, key=lambda s: abs(s[0] - at))[1]
