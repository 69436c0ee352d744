"""Exporter benchmark: what ``--metrics-listen`` adds to ``runwatch watch`` over 8 live runs of 4
datasets each, and how fast a scrape answers.

The fleet of ``livefleet`` (one record per dataset per second, after 300 written up front) is
watched by two watchers at the default interval, over the same seconds: one plain (the
baseline), one serving ``/metrics`` and scraped every ``--scrape-interval`` seconds (15, a usual
Prometheus setting), as Prometheus would. Both start with full rate rings (``bench_watch``'s
history), on copies of one config (the watch lock is per config). Printed:

1. the CPU the exporter adds: the serving watcher's CPU minus the baseline's, as a share of one
   core (target <= 0.5 %), each beside the other; and, measured apart, the CPU one scrape costs
   the watcher (a burst of scrapes after the window: CPU time / scrapes), times the scrape rate;
2. the scrape latency (request to last byte) of the scrapes in the window and of the burst:
   median, p99, max (target: max of the window <= 20 ms) and the exposition's size.

Run: ``.venv/bin/python tests/perf/bench_exporter.py [--seconds 60]``. Exit status 1 when a
target is missed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from bench_watch import fill_history, wait_for
from livefleet import PER_RUN, RUNS, end_on_sigterm, make_fleet, usage

from supervisor import history
from supervisor.config import Config, load_config

BURST = 200
"""Scrapes back to back after the window, for the CPU of one scrape and the latency spread."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(url: str) -> tuple[float, int]:
    """Seconds from request to last byte, and the body's size."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seconds", type=float, default=float(os.environ.get("BENCH_EXPORTER_SECONDS", "60"))
    )
    ap.add_argument("--scrape-interval", type=float, default=15.0)
    args = ap.parse_args()
    end_on_sigterm()

    tmp = Path(tempfile.mkdtemp(prefix="runwatch-bench-exporter-"))
    os.environ["XDG_STATE_HOME"] = str(tmp / "state")
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    config, argvs = make_fleet(tmp, None)
    # A copy of the config, another file with other content: the watch lock is per config.
    other = tmp / "exporter.toml"
    other.write_text("# the same fleet, watched with the exporter\n" + config.read_text())
    now = time.time()
    for path in (config, other):
        fill_history(path, "bench", 3.0, now)
    interval = Config().refresh_seconds
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    clients = [
        subprocess.Popen(a, cwd=tmp / "work", stdin=subprocess.DEVNULL, start_new_session=True)
        for a in argvs
    ]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for path, extra in ((config, []), (other, ["--metrics-listen", f"127.0.0.1:{port}"])):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tui.cli", "-c", str(path), "watch", "--json", *extra],
                    stdin=subprocess.DEVNULL,
                    stdout=(tmp / f"{path.stem}.out").open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        saved = [history.history_path(load_config(str(p)).key) for p in (config, other)]
        stamps = [history.saved_at(p) for p in saved]

        def both_saved() -> bool:
            return all(history.saved_at(p) != s for p, s in zip(saved, stamps, strict=True))

        wait_for("both watchers' first history save", both_saved, 90)

        def served() -> bool:
            try:
                body = _body(url)
            except OSError:
                return False
            configured = re.findall(r'^runwatch_dataset_records\{[^}]*run="run[0-9]+"', body, re.M)
            return len(configured) >= RUNS * PER_RUN

        wait_for("every dataset in a scrape", served, 60)

        window: list[float] = []
        size = 0
        stop = threading.Event()

        def scraper() -> None:
            nonlocal size
            while not stop.is_set():
                took, size = scrape(url)
                window.append(took)
                stop.wait(args.scrape_interval)

        thread = threading.Thread(target=scraper, daemon=True)
        thread.start()
        plain, serving = usage([psutil.Process(p.pid) for p in procs], args.seconds)
        stop.set()
        thread.join(15)

        me = psutil.Process(procs[1].pid)
        c0 = me.cpu_times()
        burst = [scrape(url)[0] for _ in range(BURST)]
        c1 = me.cpu_times()
        per_scrape_s = ((c1.user - c0.user) + (c1.system - c0.system)) / BURST
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    finally:
        for p in procs + clients:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    added = serving.cpu - plain.cpu
    per_scrape_cpu = 100 * per_scrape_s / args.scrape_interval
    worst = max(window)
    ok_cpu = added <= 0.5
    ok_latency = worst <= 0.020
    print(
        f"bench_exporter: {RUNS} live runs x {PER_RUN} datasets, refresh every {interval:g} s, "
        f"watched {args.seconds:.0f} s, scraped every {args.scrape_interval:g} s "
        f"({len(window)} scrapes of {size / 1024:.0f} KiB)"
    )
    print(
        f"  CPU, watcher + exporter {serving.cpu:6.2f} %   watcher alone (baseline) "
        f"{plain.cpu:.2f} %   added {added:+.2f} % (ratio {serving.cpu / plain.cpu:.2f})   "
        f"target <= 0.5 %: {'ok' if ok_cpu else 'MISSED'}"
    )
    print(
        f"  CPU of one scrape       {1000 * per_scrape_s:6.2f} ms (burst of {BURST}): "
        f"{per_scrape_cpu:.3f} % of a core at one scrape every {args.scrape_interval:g} s"
    )
    print(
        f"  scrape latency, window  median {1000 * statistics.median(window):.1f} ms, max "
        f"{1000 * worst:.1f} ms   target <= 20 ms: {'ok' if ok_latency else 'MISSED'}"
    )
    print(
        f"  scrape latency, burst   median {1000 * statistics.median(burst):.1f} ms, p99 "
        f"{1000 * percentile(burst, 0.99):.1f} ms, max {1000 * max(burst):.1f} ms"
    )
    return 0 if ok_cpu and ok_latency else 1


def _body(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        text: str = r.read().decode()
        return text


if __name__ == "__main__":
    sys.exit(main())
