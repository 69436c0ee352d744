"""Scanner benchmark on a generated ``raw`` file.

Measured in the same run and printed:

1. cold-scan throughput of ``Scanner.scan`` (sampled validation, the default) on a ~1 GB file of
   3,500 tokens per record on average with ids up to 163,840;
2. its ratio to ``wc -l`` on the same file (target: within 4x) and to a plain
   ``json.loads``-per-line loop (target: >= 10x faster);
3. one incremental refresh after appending 100 records, to a 10 MB file and to the 1 GB file
   (median of 21, the two files taking turns; target: 1 GB within 1.5x of 10 MB);
4. peak RSS of a process doing the cold scan (target: < 100 MB + the longest line).

Every timing is the best (or median) of repeated runs on a file already in the page cache, so the
figures compare CPU work, not disk; the cold-scan ratios are judged on CPU time (user + system, of
this process or of ``wc``), which a busy shared machine does not inflate, and wall time is printed
beside it. Run::

    .venv/bin/python tests/perf/bench_scan.py            # 1 GB (default)
    BENCH_SCAN_MB=100 .venv/bin/python tests/perf/bench_scan.py   # quicker
    .venv/bin/python tests/perf/bench_scan.py --size-mb 200 --strict  # exit 1 on a missed target

The temporary directory (and the file) are deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.agent.scan import Scanner  # noqa: E402

MEAN_TOKENS = 3500
MAX_ID = 163_840
POOL = 48


def _pool(rng: random.Random) -> list[bytes]:
    """Encoded ``output_ids`` arrays of 1,000..6,000 tokens (mean 3,500), reused across records."""
    out = []
    for _ in range(POOL):
        n = rng.randint(1000, 6000)
        out.append(json.dumps([rng.randrange(MAX_ID) for _ in range(n)]).encode())
    return out


def _records(rng: random.Random, pool: list[bytes], start: int, count: int) -> bytes:
    parts = []
    for i in range(start, start + count):
        arr = pool[rng.randrange(POOL)]
        n = arr.count(b",") + 1
        sid = rng.randrange(MAX_ID)
        parts.append(
            b'{"sample_id": "B2-%06d", "output_ids": %s, "prompt_tokens": %d, '
            b'"completion_tokens": %d, "finish_reason": "%s"}\n'
            % (sid, arr, rng.randint(50, 900), n, b"stop" if i % 9 else b"length")
        )
    return b"".join(parts)


def generate(path: Path, size: int, rng: random.Random, pool: list[bytes]) -> int:
    """Write records until ``size`` bytes; the number written."""
    written = n = 0
    with path.open("wb") as f:
        while written < size:
            block = _records(rng, pool, n, 200)
            f.write(block)
            written += len(block)
            n += 200
    return n


class Timed:
    """Best wall time and best CPU time (user + system, children included) of repeated runs.

    The CPU figure is what the targets are judged on: on a shared machine a preempted run's wall
    time measures the other tenants, its CPU time measures the work.
    """

    def __init__(self, fn: Callable[[], object], repeat: int) -> None:
        walls, cpus = [], []
        for _ in range(repeat):
            c0 = _cpu()
            t = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t)
            cpus.append(_cpu() - c0)
        self.wall = min(walls)
        self.cpu = min(cpus)


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def wc_l(path: Path) -> None:
    subprocess.run(["wc", "-l", str(path)], check=True, capture_output=True)


def json_loop(path: Path) -> int:
    n = 0
    with path.open("rb") as f:
        for line in f:
            json.loads(line)
            n += 1
    return n


CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from supervisor.agent.scan import Scanner
t = time.perf_counter()
r = Scanner().scan(sys.argv[1])
dt = time.perf_counter() - t
print(json.dumps({"seconds": dt, "records": r["records"], "bad": r["bad_lines_total"],
                  "tokens": r["completion_tokens"],
                  "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def refresh_times(
    paths: list[Path], rng: random.Random, pool: list[bytes], rounds: int
) -> list[float]:
    """Median CPU time of one scan after appending 100 records, per file (state warm from a cold
    scan). The files take turns, so a burst of load on the machine hits both alike."""
    scanners = [Scanner() for _ in paths]
    for scanner, path in zip(scanners, paths, strict=True):
        scanner.scan(str(path))
    times: list[list[float]] = [[] for _ in paths]
    for k in range(rounds):
        for i, (scanner, path) in enumerate(zip(scanners, paths, strict=True)):
            block = _records(rng, pool, 10_000_000 + k * 100, 100)
            with path.open("ab") as f:
                f.write(block)
            t = time.process_time()
            r = scanner.scan(str(path))
            times[i].append(time.process_time() - t)
            assert r["rescan_reason"] is None and r["bytes_read"] == len(block)
    return [statistics.median(t) for t in times]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=int(os.environ.get("BENCH_SCAN_MB", "1024")))
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    size = args.size_mb * 1_000_000
    rng = random.Random(20240601)
    pool = _pool(rng)
    longest = max(len(a) for a in pool) + 200
    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    try:
        big = tmp / "big" / "raw_responses.jsonl"
        small = tmp / "small" / "raw_responses.jsonl"
        big.parent.mkdir()
        small.parent.mkdir()
        t = time.perf_counter()
        n_big = generate(big, size, rng, pool)
        generate(small, 10_000_000, rng, pool)
        real = big.stat().st_size
        print(
            f"generated {real / 1e6:,.0f} MB, {n_big:,} records in {time.perf_counter() - t:.1f} s"
        )

        wc_l(big)  # warm the page cache
        wc = Timed(lambda: wc_l(big), 5)
        sc = Timed(lambda: Scanner().scan(str(big)), 3)
        r = Scanner().scan(str(big))
        assert r["records"] == n_big and r["bad_lines_total"] == 0, r["bad_lines"][:3]
        js = Timed(lambda: json_loop(big), 1)
        child = subprocess.run(
            [sys.executable, "-c", CHILD, str(big), str(ROOT)],
            check=True,
            capture_output=True,
            text=True,
        )
        c = json.loads(child.stdout)
        rss_mb = c["rss_kb"] / 1024
        t_small, t_big = refresh_times([small, big], rng, pool, 21)

        mbps = real / 1e6 / sc.wall
        vs_wc = sc.cpu / wc.cpu
        vs_json = js.cpu / sc.cpu
        vs_small = t_big / t_small
        limit_rss = 100 + longest / 1e6
        print(
            f"cold scan        wall {sc.wall:7.3f} s  cpu {sc.cpu:7.3f} s  {mbps:7,.0f} MB/s  "
            f"{r['records']:,} records, {r['completion_tokens']:,} tokens, "
            f"{r['validated']} validated"
        )
        print(
            f"wc -l            wall {wc.wall:7.3f} s  cpu {wc.cpu:7.3f} s  "
            f"scan/wc = {vs_wc:.2f}x cpu, {sc.wall / wc.wall:.2f}x wall  (target <= 4x)"
        )
        print(
            f"json.loads loop  wall {js.wall:7.3f} s  cpu {js.cpu:7.3f} s  "
            f"json/scan = {vs_json:.1f}x cpu, {js.wall / sc.wall:.1f}x wall  (target >= 10x)"
        )
        print(
            f"refresh +100 rec (cpu) 10 MB: {t_small * 1e3:.2f} ms   {real / 1e9:.1f} GB: "
            f"{t_big * 1e3:.2f} ms   ratio {vs_small:.2f}x  (target <= 1.5x)"
        )
        print(
            f"peak RSS (cold scan in a fresh process) {rss_mb:.1f} MB; longest line "
            f"{longest / 1e3:.0f} kB  (target < {limit_rss:.1f} MB); "
            f"scan there took {c['seconds']:.3f} s"
        )
        missed = [
            name
            for name, ok in (
                ("scan vs wc -l", vs_wc <= 4),
                ("scan vs json.loads", vs_json >= 10),
                ("refresh ratio", vs_small <= 1.5),
                ("peak RSS", rss_mb < limit_rss),
            )
            if not ok
        ]
        print("targets: all met" if not missed else "targets missed: " + ", ".join(missed))
        return 1 if missed and args.strict else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
