"""TUI benchmark: the dashboard in a real terminal (tmux) watching 8 live runs of 4 datasets each.

A local host runs 8 stand-in clients (``bench_tui_client.py``) that append one record of 50..300
tokens to each of their 4 datasets every second (after 300 records written up front); the
dashboard watches them at a 1 s refresh. Measured in the same run and printed, each beside its
baseline:

1. Time to first paint: from starting ``runwatch tui`` to the dashboard showing the first run's
   datasets with token counts, next to the same for a bare Textual app showing one line in the
   same terminal (interpreter and Textual start-up); the best of 3 starts of each, taking turns,
   both from compiled modules (ours are compiled first, as installing them compiles them).
   Target: within 0.2 s of the bare app.
2. Steady state while watching (``--seconds``, default 60; ``--minutes`` for a long run): the
   app's CPU (share of one core; target <= 3 %), its RSS sampled every second (peak; target
   <= 100 MB) and, on a watch of 13 minutes or more, the RSS growth per hour (least squares over
   the samples after the first 11 minutes: the engine keeps 10 minutes of samples per dataset for
   its rates, so RSS grows until then; target: the RSS projected to one hour stays <= 100 MB).
   Baseline: the bare Textual app, idle. The host agent it talks to is reported apart (on a fleet
   it runs on the GPU host).

Run: ``.venv/bin/python tests/perf/bench_tui.py [--seconds 60 | --minutes 15]`` (needs tmux).
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil

RUNS = 8
PER_RUN = 4
SEED_RECORDS = 300
BASELINE_S = 5.0
PAINTS = 3
SOCKET = f"runwatch-bench-{os.getpid()}"
TOKENS = re.compile(r"\b\d[\d,.]* ?[kM]? / \d[\d,.]* ?[kM]\b")
BARE_APP = """\
from textual.app import App
from textual.widgets import Static
class Bare(App):
    def compose(self):
        yield Static("bare textual app ready")
Bare().run()
"""
CLIENT_NAME = "bench_tui_client.py"
"""The stand-in client's script, the config's only script: the runs of others on a shared machine
(``run_inference.py`` of their tests) are then not listed by the dashboard under test."""
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


def datasets_of(run: int) -> list[str]:
    return [f"B{run}{k}" for k in range(1, PER_RUN + 1)]


def make_fleet(base: Path) -> tuple[Path, list[list[str]]]:
    """The work dir with seeded datasets and the client, and the config; (config, client argvs)."""
    work = base / "work"
    work.mkdir()
    (work / CLIENT_NAME).write_text(CLIENT)
    rng = random.Random(7)
    lines = [
        "refresh_seconds = 1.0",
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


def tmux(*args: str) -> str:
    out = subprocess.run(
        ["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=10, check=False
    )
    return out.stdout


def start(name: str, argv: list[str], env: dict[str, str]) -> tuple[float, psutil.Process]:
    """Start ``argv`` in its own tmux window (no shell) at 160x48; (start time, its process)."""
    t0 = time.perf_counter()
    subprocess.run(
        ["tmux", "-L", SOCKET, "-f", "/dev/null", "new-session", "-d", "-s", name,
         "-x", "160", "-y", "48", "--", *argv],
        env=env, check=True, timeout=10,
    )  # fmt: skip
    pid = int(tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())
    return t0, psutil.Process(pid)


def wait_screen(name: str, ready: object, timeout: float = 30.0) -> float:
    """Poll the pane until ``ready(text)``; the perf_counter time it was first seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = tmux("capture-pane", "-p", "-t", name)
        if ready(text):  # type: ignore[operator]
            return time.perf_counter()
        time.sleep(0.01)  # capture-pane polling interval
    raise SystemExit(f"{name}: not ready after {timeout} s:\n{text}")


def steady(
    proc: psutil.Process, seconds: float
) -> tuple[float, list[tuple[float, float]], dict[int, float]]:
    """CPU % of one core of ``proc`` over ``seconds``, its RSS (s, MB) sampled every second, and
    its children's CPU % apart."""
    kids = {c.pid: c for c in proc.children(recursive=True)}
    c0 = proc.cpu_times()
    k0 = {pid: sum(c.cpu_times()[:2]) for pid, c in kids.items()}
    t0 = time.perf_counter()
    samples = [(0.0, proc.memory_info().rss / 2**20)]
    end = t0 + seconds
    while time.perf_counter() < end:
        time.sleep(min(1.0, max(0.0, end - time.perf_counter())))  # the sampling period
        samples.append((time.perf_counter() - t0, proc.memory_info().rss / 2**20))
    c1 = proc.cpu_times()
    wall = time.perf_counter() - t0
    cpu = 100 * ((c1.user - c0.user) + (c1.system - c0.system)) / wall
    kid_cpu = {}
    for pid, c in kids.items():
        try:
            kid_cpu[pid] = 100 * (sum(c.cpu_times()[:2]) - k0[pid]) / wall
        except psutil.Error:
            continue
    return cpu, samples, kid_cpu


WARMUP_S = 660.0
"""RSS grows while the rate windows fill (10 minutes of samples); growth is judged after."""


def growth_per_hour(samples: list[tuple[float, float]]) -> float | None:
    """MB per hour: the least-squares slope of RSS over the samples after :data:`WARMUP_S`
    (None when the watch was too short to tell)."""
    tail = [s for s in samples if s[0] >= WARMUP_S]
    if not tail or tail[-1][0] - tail[0][0] < 120:
        return None
    mt = sum(t for t, _ in tail) / len(tail)
    mr = sum(r for _, r in tail) / len(tail)
    var = sum((t - mt) ** 2 for t, _ in tail)
    return 3600 * sum((t - mt) * (r - mr) for t, r in tail) / var if var else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seconds", type=float, default=float(os.environ.get("BENCH_TUI_SECONDS", "60"))
    )
    ap.add_argument("--minutes", type=float, default=None, help="watch this long instead")
    args = ap.parse_args()
    watch_s = args.minutes * 60 if args.minutes else args.seconds

    # Both apps start from compiled modules, as installed packages do (pip compiles Textual's;
    # ours are compiled here: with PYTHONDONTWRITEBYTECODE set, every start would compile them).
    root = Path(__file__).resolve().parents[2]
    for package in ("supervisor", "tui"):
        compileall.compile_dir(root / package, quiet=1)
    tmp = Path(tempfile.mkdtemp(prefix="runwatch-bench-tui-"))
    os.environ["XDG_STATE_HOME"] = str(tmp / "state")
    env = {**os.environ, "TERM": "xterm-256color"}
    config, argvs = make_fleet(tmp)
    clients = [
        subprocess.Popen(a, cwd=tmp / "work", stdin=subprocess.DEVNULL, start_new_session=True)
        for a in argvs
    ]
    try:
        # Baseline: a bare Textual app in the same terminal. First paints: the best of
        # PAINTS starts of each, taking turns (a burst of load on the machine hits both alike).
        bare = tmp / "bare.py"
        bare.write_text(BARE_APP)
        argv = [sys.executable, "-m", "tui.cli", "-c", str(config), "tui"]

        def painted(text: str) -> bool:
            names = all(re.search(rf"\b{d}\b", text) for d in datasets_of(1))
            return names and bool(TOKENS.search(text))

        bare_paints, paints = [], []
        for k in range(PAINTS):
            t0, bare_proc = start("bare", [sys.executable, str(bare)], env)
            bare_paints.append(wait_screen("bare", lambda s: "bare textual app ready" in s) - t0)
            if k == PAINTS - 1:
                bare_cpu, bare_rss, _ = steady(bare_proc, BASELINE_S)
            tmux("kill-session", "-t", "bare")
            t0, app = start("tui", argv, env)
            paints.append(wait_screen("tui", painted) - t0)
            if k < PAINTS - 1:
                tmux("kill-session", "-t", "tui")
                app.wait(timeout=10)
        bare_paint, paint = min(bare_paints), min(paints)
        cpu, samples, agents = steady(app, watch_s)
        screen = tmux("capture-pane", "-p", "-t", "tui")
        assert painted(screen), screen
        tmux("send-keys", "-t", "tui", "q")
    finally:
        tmux("kill-server")
        for c in clients:
            c.kill()
            c.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    rss = max(r for _, r in samples)
    bare_peak = max(r for _, r in bare_rss)
    growth = growth_per_hour(samples)
    end_s, end_mb = samples[-1]
    projected = end_mb + max(0.0, growth or 0.0) * max(0.0, 1 - end_s / 3600)
    agent_cpu = sum(agents.values())
    ok_paint = paint - bare_paint <= 0.2
    ok_cpu = cpu <= 3
    ok_rss = rss <= 100 and (growth is None or projected <= 100)
    trend = (
        "growth not judged (watch >= 13 min: --minutes 15)"
        if growth is None
        else f"growth {growth:+.1f} MB/h after {WARMUP_S / 60:.0f} min, {projected:.0f} MB at 1 h"
    )
    print(
        f"bench_tui: {RUNS} live runs x {PER_RUN} datasets, 1 s refresh, watched {watch_s:.0f} s "
        "at 160x48"
    )
    print(
        f"  first paint      {paint:6.2f} s   (bare Textual app: {bare_paint:.2f} s, "
        f"+{paint - bare_paint:.2f} s)   target <= bare + 0.2 s: {'ok' if ok_paint else 'MISSED'}"
    )
    print(
        f"  CPU, steady      {cpu:6.1f} %   (bare Textual app idle: {bare_cpu:.1f} %)   "
        f"target <= 3 %: {'ok' if ok_cpu else 'MISSED'}"
    )
    print(
        f"  RSS              {rss:6.0f} MB  peak, {samples[0][1]:.0f} MB after first paint, "
        f"{end_mb:.0f} MB at the end; {trend} (bare Textual app: {bare_peak:.0f} MB)   "
        "target <= 100 MB: "
        f"{'ok' if ok_rss else 'MISSED'}"
    )
    print(
        f"  host agent CPU   {agent_cpu:6.1f} %   (local agent subprocess; on a fleet it runs "
        "on the host)"
    )
    return 0 if ok_paint and ok_cpu and ok_rss else 1


if __name__ == "__main__":
    sys.exit(main())
