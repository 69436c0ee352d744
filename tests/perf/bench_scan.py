"""Scanner benchmark on generated ``raw`` files of the two record sizes users have.

Measured in the same run and printed, each figure beside its baseline:

1. cold-scan CPU time of ``Scanner.scan`` (sampled validation, the default) on a file of small
   records (~1.4 KB: 50..300 output tokens) and one of big records (~27 KB: 1,000..6,000 tokens,
   ids up to 163,840), next to a plain ``json.loads``-per-line loop (target: >= 10x faster on
   both) and ``wc -l`` (target: within 3x on the big records); >= 800,000 small records/s. The
   counts (records, completion and prompt tokens) must equal the ``json.loads`` loop's;
2. one incremental refresh after appending 100 records, to a 10 MB file and to the big file
   (median of 21, the two files taking turns; target: big within 1.5x of 10 MB);
3. peak RSS of a process doing the cold scan of each file (target: < 100 MB + the longest line);
4. first connect: an engine whose one local host holds a run of 8 datasets of small records
   (``--connect-mb`` each) starts the agent and refreshes once; the time until every dataset has
   a count on the model (the provisional line counts the agent sends first, see
   ``supervisor.provisional``) against ``wc -l`` over the same files plus one agent round trip
   (target: within 2x of that, the median of three connects, each printed); the time until the
   full scan's reply is printed beside it, with the number of progress snapshots seen while it
   ran.

Every timing is the best (or median) of repeated runs on files already in the page cache, so the
figures compare CPU work, not disk; the cold-scan ratios are judged on CPU time (user + system, of
this process or of ``wc``), which a busy shared machine does not inflate, and wall time is printed
beside it. The first-connect figures are wall times (the agent is another process). Run::

    .venv/bin/python tests/perf/bench_scan.py            # 1 GB per record size (default)
    BENCH_SCAN_MB=100 .venv/bin/python tests/perf/bench_scan.py   # quicker
    .venv/bin/python tests/perf/bench_scan.py --size-mb 250 --connect-mb 50

Exit status 1 when a target is missed. The temporary directory (and the files) are deleted at the
end.
"""

from __future__ import annotations

import argparse
import asyncio
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
from typing import cast

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.agent.scan import Scanner  # noqa: E402
from supervisor.config import Config, HostConfig, RunConfig  # noqa: E402
from supervisor.engine import Engine  # noqa: E402
from supervisor.hosts import LocalHost  # noqa: E402
from supervisor.model import Snapshot  # noqa: E402

MAX_ID = 163_840
POOL = 48
SMALL_TOKENS = (50, 300)
BIG_TOKENS = (1000, 6000)
CONNECT_FILES = 8
CONNECT_RUNS = 3
"""First connects measured (each a new engine and agent); the median is judged."""


def _pool(rng: random.Random, tokens: tuple[int, int]) -> list[bytes]:
    """Encoded ``output_ids`` arrays of ``tokens`` items (a range), reused across records."""
    out = []
    for _ in range(POOL):
        n = rng.randint(*tokens)
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
            self.value = fn()
            walls.append(time.perf_counter() - t)
            cpus.append(_cpu() - c0)
        self.wall = min(walls)
        self.cpu = min(cpus)


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def wc_l(*paths: Path) -> int:
    out = subprocess.run(["wc", "-l", *map(str, paths)], check=True, capture_output=True)
    return int(out.stdout.split()[-2])


def json_loop(path: Path) -> tuple[int, int, int]:
    """Records, completion tokens and prompt tokens, by ``json.loads`` of every line."""
    n = completion = prompt = 0
    with path.open("rb") as f:
        for line in f:
            rec = json.loads(line)
            n += 1
            completion += rec["completion_tokens"]
            prompt += rec["prompt_tokens"]
    return n, completion, prompt


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


class Targets:
    """Targets judged so far; each printed line says ``ok`` or ``MISSED``."""

    def __init__(self) -> None:
        self.missed: list[str] = []

    def mark(self, name: str, ok: bool) -> str:
        if not ok:
            self.missed.append(name)
        return "ok" if ok else "MISSED"


def cold(
    label: str, path: Path, targets: Targets, wc_limit: float | None, rate: float | None
) -> None:
    """Cold scan of ``path`` against ``json.loads`` and ``wc -l``; counts checked exactly."""
    wc_l(path)  # warm the page cache
    wc = Timed(lambda: wc_l(path), 5)
    sc = Timed(lambda: Scanner().scan(str(path)), 3)
    js = Timed(lambda: json_loop(path), 1)
    r = sc.value
    assert isinstance(r, dict)
    n, completion, prompt = cast(tuple[int, int, int], js.value)
    assert r["bad_lines_total"] == 0, r["bad_lines"][:3]
    assert (r["records"], r["completion_tokens"], r["prompt_tokens"]) == (n, completion, prompt), (
        "the scan and the json.loads loop disagree",
        (r["records"], r["completion_tokens"], r["prompt_tokens"]),
        (n, completion, prompt),
    )
    assert wc.value == n
    size = path.stat().st_size
    vs_json = js.cpu / sc.cpu
    vs_wc = sc.cpu / wc.cpu
    per_s = n / sc.cpu
    print(
        f"cold scan {label}: {sc.cpu:.3f} s cpu ({vs_json:.1f}x json.loads loop {js.cpu:.2f} s; "
        f"{vs_wc:.1f}x wc -l {wc.cpu:.3f} s)  wall {sc.wall:.3f} s "
        f"({js.wall / sc.wall:.1f}x json wall {js.wall:.2f} s; {sc.wall / wc.wall:.1f}x wc wall "
        f"{wc.wall:.3f} s)"
    )
    print(
        f"    {size / 1e6:,.0f} MB, {n:,} records ({size / n / 1e3:.1f} KB each), "
        f"{r['completion_tokens']:,} tokens, {r['validated']} validated; counts equal the "
        f"json.loads loop's; {per_s:,.0f} records/s cpu, {size / 1e6 / sc.wall:,.0f} MB/s wall"
    )
    print(f"    target >= 10x json.loads: {targets.mark(label + ' vs json.loads', vs_json >= 10)}")
    if wc_limit is not None:
        ok = vs_wc <= wc_limit
        print(f"    target <= {wc_limit:g}x wc -l: {targets.mark(label + ' vs wc -l', ok)}")
    if rate is not None:
        ok = per_s >= rate
        print(f"    target >= {rate:,.0f} records/s: {targets.mark(label + ' records/s', ok)}")


def peak_rss(label: str, path: Path, longest: int, targets: Targets) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    c = json.loads(child.stdout)
    rss_mb = c["rss_kb"] / 1024
    limit = 100 + longest / 1e6
    print(
        f"peak RSS, cold scan of {label} in a fresh process: {rss_mb:.1f} MB (limit "
        f"100 MB + longest line {longest / 1e3:.0f} kB); scan there took {c['seconds']:.3f} s: "
        f"{targets.mark(label + ' peak RSS', rss_mb < limit)}"
    )


async def round_trip() -> float:
    """The best of 5 ping round trips to a local agent."""
    host = LocalHost(HostConfig(name="bench", local=True, command_timeout=600.0))
    try:
        await host.connect()
        rtts = []
        for _ in range(5):
            t = time.perf_counter()
            await host.request("ping")
            rtts.append(time.perf_counter() - t)
    finally:
        await host.close()
    return min(rtts)


async def first_connect(work: Path, datasets: list[str]) -> tuple[float, float, int, Snapshot]:
    """An engine's first refresh of a local host with one run of ``datasets``: (seconds until
    every dataset had a count on the model, seconds until the refresh returned, progress
    snapshots seen, the snapshot)."""
    config = Config(
        hosts=[HostConfig(name="bench", local=True, command_timeout=600.0)],
        runs=[
            RunConfig(
                name="bench",
                host="bench",
                workdir=str(work),
                argv=[
                    *("python3", "run_inference.py", "--datasets", ",".join(datasets)),
                    *("--output-dir", "."),
                ],
            )
        ],
    )
    counted_at: list[float] = []
    seen = 0

    def progressed(snap: Snapshot) -> None:
        nonlocal seen
        seen += 1
        run = next(r for r in snap.hosts[0].runs if r.name == "bench")
        counts = [d.provisional or d.records > 0 for d in run.datasets]
        if not counted_at and len(counts) == len(datasets) and all(counts):
            counted_at.append(time.perf_counter())

    async with Engine(config) as engine:
        t = time.perf_counter()
        snap = await engine.refresh(on_progress=progressed)
        total = time.perf_counter() - t
    counted = (counted_at[0] if counted_at else t + total) - t
    return counted, total, seen, snap


def connect_bench(tmp: Path, per_file: int, rng: random.Random, targets: Targets) -> None:
    pool = _pool(rng, SMALL_TOKENS)
    datasets = [f"B{i}" for i in range(1, CONNECT_FILES + 1)]
    first = tmp / "connect" / "B1" / "raw_responses.jsonl"
    first.parent.mkdir(parents=True)
    n = generate(first, per_file, rng, pool)
    paths = [first]
    for ds in datasets[1:]:
        p = tmp / "connect" / ds / "raw_responses.jsonl"
        p.parent.mkdir()
        shutil.copyfile(first, p)
        paths.append(p)
    wc_l(*paths)  # warm the page cache
    wc = Timed(lambda: wc_l(*paths), 3)
    rtt = asyncio.run(round_trip())
    runs = []
    for _ in range(CONNECT_RUNS):
        counted, total, seen, snap = asyncio.run(first_connect(tmp / "connect", datasets))
        run = next(r for r in snap.hosts[0].runs if r.name == "bench")
        records = [d.records for d in run.datasets]
        assert records == [n] * len(paths), records
        assert not any(d.provisional for d in run.datasets)
        runs.append((counted, total, seen))
    counted, total, seen = sorted(runs)[len(runs) // 2]
    baseline = wc.wall + rtt
    size = sum(p.stat().st_size for p in paths)
    print(
        f"first connect, {CONNECT_FILES} files x {per_file / 1e6:,.0f} MB ({size / 1e6:,.0f} MB, "
        f"{n * len(paths):,} records), median of {CONNECT_RUNS} engines: every dataset counted "
        f"on the model after {counted:.2f} s ({counted / baseline:.1f}x wc -l {wc.wall:.3f} s + "
        f"one round trip {rtt * 1e3:.1f} ms; each: "
        f"{', '.join(f'{c:.2f}' for c, _, _ in runs)} s); full scan done after {total:.2f} s "
        f"({total / baseline:.1f}x), {seen} progress snapshots before it"
    )
    print(f"    target <= 2x: {targets.mark('first connect', counted <= 2 * baseline)}")


def scan_benches(
    tmp: Path,
    size: int,
    size_mb: int,
    rng: random.Random,
    small_pool: list[bytes],
    big_pool: list[bytes],
    longest: int,
    targets: Targets,
) -> None:
    """Parts 1 to 3: cold scans, the incremental refresh, peak RSS."""
    small = tmp / "small" / "raw_responses.jsonl"
    big = tmp / "big" / "raw_responses.jsonl"
    ten = tmp / "ten" / "raw_responses.jsonl"
    for p in (small, big, ten):
        p.parent.mkdir()
    t = time.perf_counter()
    generate(small, size, rng, small_pool)
    generate(big, size, rng, big_pool)
    generate(ten, 10_000_000, rng, big_pool)
    print(f"generated 2 x {size_mb:,} MB in {time.perf_counter() - t:.1f} s")

    cold("1.4 KB records", small, targets, None, 800_000)
    cold("27 KB records", big, targets, 3, None)
    t_small, t_big = refresh_times([ten, big], rng, big_pool, 21)
    ratio = t_big / t_small
    print(
        f"refresh +100 records (cpu): {size / 1e9:.1f} GB file {t_big * 1e3:.2f} ms "
        f"({ratio:.2f}x the 10 MB file's {t_small * 1e3:.2f} ms; target <= 1.5x: "
        f"{targets.mark('refresh ratio', ratio <= 1.5)})"
    )
    peak_rss("1.4 KB records", small, longest, targets)
    peak_rss("27 KB records", big, longest, targets)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--size-mb",
        type=int,
        default=int(os.environ.get("BENCH_SCAN_MB", "1024")),
        help="size of each cold-scan file (0: skip the cold scans, refresh and RSS parts)",
    )
    ap.add_argument(
        "--connect-mb",
        type=int,
        default=int(os.environ.get("BENCH_CONNECT_MB", "250")),
        help="size of each of the 8 files of the first-connect bench (0: skip it)",
    )
    args = ap.parse_args()
    size = args.size_mb * 1_000_000
    rng = random.Random(20240601)
    small_pool = _pool(rng, SMALL_TOKENS)
    big_pool = _pool(rng, BIG_TOKENS)
    longest = max(len(a) for a in big_pool) + 200
    targets = Targets()
    tmp = Path(tempfile.mkdtemp(prefix="bench-scan-"))
    os.environ["XDG_STATE_HOME"] = str(tmp / "state")
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    try:
        if size > 0:
            scan_benches(tmp, size, args.size_mb, rng, small_pool, big_pool, longest, targets)
        if args.connect_mb > 0:
            connect_bench(tmp, args.connect_mb * 1_000_000, rng, targets)
        missed = targets.missed
        print("targets: all met" if not missed else "targets MISSED: " + ", ".join(missed))
        return 1 if missed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
