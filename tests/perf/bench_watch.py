"""Watcher benchmark: ``runwatch watch`` over 8 live runs of 4 datasets each, as it runs for days.

A local host runs the stand-in clients of ``livefleet`` (one record per dataset per second, after
300 written up front); ``runwatch watch --json`` watches them at its default interval (the
config's ``refresh_seconds``, left at its default). Measured in the same run, over the same
seconds, and printed, each beside its baseline:

1. the watcher's steady CPU (user + system) as a share of one core (target <= 3 %);
2. its RSS sampled every second: the peak (target <= 100 MB) and, on a watch of 13 minutes or
   more, the growth per hour (least squares over the samples after the first 11 minutes: the
   engine keeps 10 minutes of samples per dataset for its rates, so RSS grows until then) and the
   RSS projected to one day of watching (target <= 100 MB).

Baseline: a bare interpreter running an asyncio loop that sleeps the same interval, watched over
the same seconds (a burst of load on the machine hits both alike). The host agent the watcher
talks to is reported apart (on a fleet it runs on the GPU host).

The watcher starts with the rate history it keeps after three hours of watching
(``--history-hours``): its rings are then full, so what it costs per refresh and what it holds
are those of a watcher running for days, not of its first minutes. The steady state starts once
the watcher has saved its history (refreshes done, ~15 s after the start). At the end one client
is killed and the watcher must report that run's death, so the figures are those of a watcher
that was watching.

Long mode (``--long``, 60 minutes unless ``--minutes`` says otherwise; ``make bench LONG=1``): the
watcher watches ONE config holding the embedded demo's runs (at the demo's refresh), the 8 live
runs and strangers' processes listed beside them (``demofleet``). Target: the RSS slope fitted
over the samples after the first 10 minutes is at most 5 MB per hour; printed beside the bare
loop's slope, with the RSS at 10 minutes and at the end and the load averages at the start and
the end.

Run: ``.venv/bin/python tests/perf/bench_watch.py [--seconds 60 | --minutes 20 | --long
[--minutes 13] [--samples FILE]]``. Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from demofleet import DEMO_HOST, demo_fleet
from livefleet import (
    LONG_WARMUP_S,
    PER_RUN,
    RUNS,
    SEED_RECORDS,
    WARMUP_S,
    Usage,
    datasets_of,
    end_on_sigterm,
    growth_per_hour,
    isolate,
    make_fleet,
    rss_at,
    usage,
)

from supervisor import history
from supervisor.config import load_config

BASELINE = """\
import asyncio, sys
async def main(interval):
    while True:
        await asyncio.sleep(interval)
asyncio.run(main(float(sys.argv[1])))
"""
PROJECT_H = 24.0
"""Hours the RSS trend is projected over: a watcher runs for days."""
LONG_MINUTES = 60.0
SLOPE_MB_H = 5.0
"""The long mode's target: RSS slope after the first 10 minutes, MB per hour."""


def wait_for(what: str, ready: object, timeout: float) -> None:
    """Poll ``ready()`` until true; exit naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():  # type: ignore[operator]
            return
        time.sleep(0.1)  # polling interval
    raise SystemExit(f"bench_watch: {what} not seen after {timeout:g} s")


def events(out: Path) -> list[dict[str, object]]:
    """The JSON lines the watcher printed so far."""
    lines = out.read_text(errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def fill_history(config: Path, host: str, hours: float, now: float) -> int:
    """Write the history a watcher of ``config`` keeps after ``hours`` of watching (every ring is
    full at ``history.STEP_S x history.MAX_POINTS`` = 3 hours): one point every ``STEP_S`` per
    dataset and per run, the counts rising to what the seeded files hold (and never above, so the
    rates carry on from it). The number of points written."""
    cfg = load_config(str(config))
    steps = min(history.MAX_POINTS, int(hours * 3600 / history.STEP_S))
    rings: dict[str, list[list[float]]] = {}
    for run in cfg.runs:
        if not run.name.removeprefix("run").isdigit():
            continue  # the demo's runs (long mode) start with no history, as in the demo
        out = Path(run.workdir) / (run.output_dir or ".")
        keys = [
            (f"ds|{host}|{out / ds / 'raw_responses.jsonl'}", 1)
            for ds in datasets_of(int(run.name.removeprefix("run")))
        ]
        keys.append((f"run|{host}|{run.name}", PER_RUN))
        for key, per in keys:
            rings[key] = [
                [
                    round(now - (steps - i) * history.STEP_S, 2),
                    SEED_RECORDS * i // steps * per,
                    SEED_RECORDS * i // steps * per * 50,  # each record has 50 tokens or more
                ]
                for i in range(1, steps + 1)
            ]
    saved = history.History(history.history_path(cfg.key))
    for key, points in rings.items():
        for t, *values in points:
            saved.add(key, t, *values, keep_newest=True)
    saved.save(now)
    saved.close()
    return sum(len(r) for r in rings.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seconds", type=float, default=float(os.environ.get("BENCH_WATCH_SECONDS", "60"))
    )
    ap.add_argument("--minutes", type=float, default=None, help="watch this long instead")
    ap.add_argument(
        "--long",
        action="store_true",
        help="the long mode: the demo, the 8 live runs and strangers' processes in one config, "
        f"watched {LONG_MINUTES:g} minutes unless --minutes says otherwise; judged on the RSS "
        "slope",
    )
    ap.add_argument(
        "--samples",
        type=Path,
        default=None,
        help="append every RSS sample to this file as it is taken (seconds, MB, baseline MB)",
    )
    ap.add_argument(
        "--history-hours",
        type=float,
        default=3.0,
        help="hours of rate history the watcher starts with (default 3: the rings are full, as "
        "after hours of watching; 0: a first start)",
    )
    args = ap.parse_args()
    if args.long:
        print(f"bench_watch --long: {isolate()}", flush=True)
    end_on_sigterm()
    if args.long and not args.minutes:
        args.minutes = LONG_MINUTES
    watch_s = args.minutes * 60 if args.minutes else args.seconds

    tmp = Path(tempfile.mkdtemp(prefix="runwatch-bench-watch-"))
    state = tmp / "state"
    os.environ["XDG_STATE_HOME"] = str(state)
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    out = tmp / "watch.out"
    procs: list[subprocess.Popen[bytes]] = []
    clients: list[subprocess.Popen[bytes]] = []
    stack = contextlib.ExitStack()
    try:
        if args.long:
            fleet = stack.enter_context(demo_fleet(tmp))
            config, clients, host = fleet.config, fleet.clients, DEMO_HOST
        else:
            config, argvs = make_fleet(tmp, None)
            clients = [
                subprocess.Popen(
                    a, cwd=tmp / "work", stdin=subprocess.DEVNULL, start_new_session=True
                )
                for a in argvs
            ]
            host = "bench"
        env = dict(os.environ)
        hours = args.history_hours
        points = fill_history(config, host, hours, time.time()) if hours else 0
        interval = load_config(str(config)).refresh_seconds
        load_start = os.getloadavg()
        with out.open("wb") as sink:
            watcher = subprocess.Popen(
                [sys.executable, "-m", "tui.cli", "-c", str(config), "watch", "--json"],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        procs.append(watcher)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", BASELINE, str(interval)],
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        saved = history.history_path(load_config(str(config)).key)
        before = history.saved_at(saved)

        def history_saved() -> bool:
            return history.saved_at(saved) != before

        wait_for("the watcher's first history save", history_saved, 60)
        me, bare = usage([psutil.Process(p.pid) for p in procs], watch_s, args.samples)
        died = clients[0]
        died.kill()
        died.wait()

        def reported() -> bool:
            return any(e.get("kind") == "run-died" and e.get("run") == "run1" for e in events(out))

        wait_for("run1's death in the watcher's output", reported, 10 * interval + 30)
        watcher.send_signal(signal.SIGTERM)
        watcher.wait(timeout=30)
        notes = [e["note"] for e in events(out) if "note" in e]
        assert notes and notes[-1] == "stopped", notes
        load_end = os.getloadavg()
    finally:
        for p in procs + clients:
            if p.poll() is None:
                p.kill()
                p.wait()
        stack.close()
        shutil.rmtree(tmp, ignore_errors=True)

    if args.long:
        return report_long(args, watch_s, interval, points, me, bare, (load_start, load_end))

    rss = max(r for _, r in me.samples)
    bare_peak = max(r for _, r in bare.samples)
    growth = growth_per_hour(me.samples)
    end_s, end_mb = me.samples[-1]
    projected = end_mb + max(0.0, growth or 0.0) * max(0.0, PROJECT_H - end_s / 3600)
    ok_cpu = me.cpu <= 3
    ok_rss = rss <= 100
    ok_growth = growth is None or projected <= 100
    trend = (
        f"growth not judged (watch >= {WARMUP_S / 60 + 2:.0f} min: --minutes 20)"
        if growth is None
        else (
            f"growth {growth:+.2f} MB/h after {WARMUP_S / 60:.0f} min (baseline "
            f"{growth_per_hour(bare.samples) or 0.0:+.2f} MB/h), {projected:.0f} MB projected "
            f"at {PROJECT_H:g} h   target <= 100 MB: {'ok' if ok_growth else 'MISSED'}"
        )
    )
    print(
        f"bench_watch: {RUNS} live runs x {PER_RUN} datasets, refresh every {interval:g} s "
        f"(the default), watched {watch_s:.0f} s, starting with {args.history_hours:g} h of "
        f"history ({points:,} points)"
    )
    print(
        f"  CPU, steady      {me.cpu:6.2f} %   (bare asyncio sleep loop: {bare.cpu:.2f} %)   "
        f"target <= 3 %: {'ok' if ok_cpu else 'MISSED'}"
    )
    print(
        f"  RSS              {rss:6.1f} MB  peak, {me.samples[0][1]:.1f} MB at the start, "
        f"{end_mb:.1f} MB at the end (bare asyncio sleep loop: {bare_peak:.1f} MB)   "
        f"target <= 100 MB: {'ok' if ok_rss else 'MISSED'}"
    )
    print(f"  RSS trend        {trend}")
    print(
        f"  host agent CPU   {sum(me.kids.values()):6.2f} %   (local agent subprocess; on a "
        "fleet it runs on the host)"
    )
    return 0 if ok_cpu and ok_rss and ok_growth else 1


def report_long(
    args: argparse.Namespace,
    watch_s: float,
    interval: float,
    points: int,
    me: Usage,
    bare: Usage,
    loads: tuple[tuple[float, ...], tuple[float, ...]],
) -> int:
    """The long mode's figures; 1 when the slope misses :data:`SLOPE_MB_H` (or is not judged)."""
    slope = growth_per_hour(me.samples, LONG_WARMUP_S)
    base = growth_per_hour(bare.samples, LONG_WARMUP_S)
    ok = slope is not None and slope <= SLOPE_MB_H
    at = LONG_WARMUP_S
    print(
        f"bench_watch --long: the demo's runs + {RUNS} live runs x {PER_RUN} datasets + "
        f"strangers' processes, one config, refresh every {interval:g} s, watched "
        f"{watch_s / 60:.1f} min, starting with {args.history_hours:g} h of history for the "
        f"live runs ({points:,} points)"
    )
    verdict = "ok" if ok else "MISSED" if slope is not None else "NOT JUDGED (watch >= 12 min)"
    print(
        f"  RSS slope        {slope if slope is not None else float('nan'):+7.2f} MB/h after "
        f"{at / 60:.0f} min (bare asyncio sleep loop: {base or 0.0:+.2f} MB/h)   "
        f"target <= {SLOPE_MB_H:g} MB/h: {verdict}"
    )
    print(
        f"  RSS              {me.samples[0][1]:6.1f} MB at the start, {rss_at(me.samples, at):.1f} "
        f"MB at {at / 60:.0f} min, {me.samples[-1][1]:.1f} MB at the end, "
        f"{max(r for _, r in me.samples):.1f} MB peak (bare: {bare.samples[0][1]:.1f} -> "
        f"{rss_at(bare.samples, at):.1f} -> {bare.samples[-1][1]:.1f} MB)"
    )
    print(f"  CPU, steady      {me.cpu:6.2f} %   (bare asyncio sleep loop: {bare.cpu:.2f} %)")
    print(
        "  load average     "
        + "  ->  ".join(" ".join(f"{v:.2f}" for v in load) for load in loads)
        + "   (1, 5, 15 min; at the start and at the end)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
