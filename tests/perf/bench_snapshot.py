"""Benchmark of the snapshot every start takes of its data files (``supervisor.snapshots``).

Measured in the same run and printed side by side, each against a baseline of the same run:

1. the snapshot of a ``--size-mb`` dataset (2 GiB by default) of raw records: by reflink on a
   loop-mounted XFS image made with ``mkfs.xfs -m reflink=1`` (btrfs where mkfs.xfs is missing),
   and by byte copy (``copy_file_range``, then SHA-256 of the source and of the copy) on an XFS
   image made with ``reflink=0``; next to ``cp --reflink=always`` on the first image (the
   baseline, 1.0x) and ``cp --reflink=never`` on the second. Best of ``--repeat`` runs for the
   reflinks, one run for each copy (the page cache holds the file: CPU and memory bandwidth, not
   the disk, are measured);
2. the restart's added wait: a real restart (the engine, the demo's reference client against the
   mock server, a ``--restart-mb`` dataset on the reflink image) with the snapshot (its check
   before the stop, the snapshot before the launch, the check after it) against the same restart
   with those three steps replaced by no-ops; median of ``--restarts`` of each, taking turns,
   printed as a ratio; beside it the wall time of the snapshot's own three steps, timed inside
   the restarts, as a ratio to the restart without them (the whole restarts vary by seconds with
   the quiet window).

Nothing is asserted on wall-clock time: the figures are printed. Exit status 1 only when the
reflink snapshot was not a reflink or a restart failed. Needs root and a loop device (the images
are loop-mounted); without them it says why and exits 0. Run::

    .venv/bin/python tests/perf/bench_snapshot.py                 # 2 GiB
    .venv/bin/python tests/perf/bench_snapshot.py --size-mb 256   # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.agent import snapshots  # noqa: E402
from tests.fixtures_reflink import unavailable  # noqa: E402

MiB = 1 << 20


def _lines(rng: random.Random, count: int, prefix: str) -> Iterator[bytes]:
    """Raw records (``output_ids`` of 300..1,500 ids, ~5 KB each), ids ``<prefix><n>``."""
    pool = [
        json.dumps([rng.randrange(163_840) for _ in range(rng.randint(300, 1500))]).encode()
        for _ in range(32)
    ]
    for i in range(count):
        ids = pool[i % len(pool)]
        yield (
            b'{"sample_id": "%s%d", "output_ids": %s, "prompt_tokens": 312, '
            b'"completion_tokens": %d, "finish_reason": "stop"}\n'
            % (prefix.encode(), i, ids, ids.count(b",") + 1)
        )


def write_dataset(path: Path, size: int, prefix: str = "old-") -> int:
    """A raw-format JSONL file of at least ``size`` bytes; its size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    done = 0
    with open(path, "wb") as f:
        buf: list[bytes] = []
        for line in _lines(rng, 1 << 40, prefix):
            buf.append(line)
            done += len(line)
            if len(buf) >= 512 or done >= size:
                f.write(b"".join(buf))
                buf = []
            if done >= size:
                break
        f.flush()
        os.fsync(f.fileno())
    return done


@contextlib.contextmanager
def mounted(where: Path, size: int, reflink: bool) -> Iterator[Path]:
    image, mnt = where / "fs.img", where / "mnt"
    mnt.mkdir(parents=True)
    with open(image, "wb") as f:
        f.truncate(size)
    if shutil.which("mkfs.xfs"):
        mkfs = ["mkfs.xfs", "-q", "-m", f"reflink={int(reflink)}", str(image)]
    elif reflink:
        mkfs = ["mkfs.btrfs", "-q", str(image)]
    else:
        mkfs = ["mkfs.ext4", "-q", str(image)]
    for cmd in (mkfs, ["mount", "-o", "loop", str(image), str(mnt)]):
        subprocess.run(cmd, check=True, capture_output=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        image.unlink()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def take(data: Path, limit: int) -> dict[str, Any]:
    root = data.parent / ".runwatch" / "snapshots" / "bench"
    return snapshots.snapshot_take(
        {"paths": [str(data)], "root": str(root), "max_bytes": limit, "keep": 1}
    )


def cp(data: Path, how: str) -> None:
    target = data.with_name(f"cp-{how}")
    subprocess.run(["cp", f"--reflink={how}", str(data), str(target)], check=True)
    subprocess.run(["sync", "-f", str(target)], check=True)
    target.unlink()


def part_one(tmp: Path, size_mb: int, repeat: int) -> tuple[list[str], bool]:
    size = size_mb * MiB
    image = max(4 * size, 1 << 30) + (1 << 30)
    rows: list[tuple[str, float]] = []
    ok = True
    with mounted(tmp / "a", image, reflink=True) as fast, mounted(tmp / "b", image, False) as slow:
        a = fast / "out" / "B1" / "raw_responses.jsonl"
        b = slow / "out" / "B1" / "raw_responses.jsonl"
        written = write_dataset(a, size)
        b.parent.mkdir(parents=True)
        shutil.copyfile(a, b)
        best_reflink, methods = float("inf"), set()
        for _ in range(repeat):
            t, r = timed(lambda: take(a, 0))
            best_reflink = min(best_reflink, t)
            methods |= {f["method"] for f in r["files"]}
        ok = methods == {"reflink"}
        best_cp = min(timed(lambda: cp(a, "always"))[0] for _ in range(repeat))
        t_copy, r = timed(lambda: take(b, written))
        copy_method = r["files"][0]["method"]
        t_cp_never = timed(lambda: cp(b, "never"))[0]
    rows = [
        (f"runwatch snapshot, reflink ({'/'.join(sorted(methods))})", best_reflink),
        ("cp --reflink=always (same image)", best_cp),
        (f"runwatch snapshot, byte copy ({copy_method} + SHA-256 check)", t_copy),
        ("cp --reflink=never (reflink=0 image)", t_cp_never),
    ]
    out = [
        f"snapshot of a {written / MiB:,.0f} MiB dataset "
        f"(XFS images, loop-mounted; best of {repeat} for the reflinks, one run per copy)",
        f"  {'method':<62} {'wall':>10} {'vs cp --reflink=always':>24}",
    ]
    for name, t in rows:
        out.append(f"  {name:<62} {t * 1000:>8.1f} ms {t / best_cp:>23.1f}x")
    return out, ok


# --------------------------------------------------------------------------- the restart


def restart_config(root: Path, url: str) -> Path:
    from supervisor.demo.prompts import write_prompts
    from tests.fixtures_actions import RUN_INFERENCE
    from tests.fixtures_config import write_local_config

    work = root / "work"
    write_prompts(work / "prompts", ["B1"], count=5000)
    shutil.copyfile(RUN_INFERENCE, work / "run_inference.py")
    argv = [
        sys.executable, "run_inference.py", "--datasets", "B1", "--prompts-dir", "prompts",
        "--output-dir", "out", "--api-base", url, "--concurrency", "2",
    ]  # fmt: skip
    return write_local_config(
        root / "runwatch.toml",
        f"""
[[runs]]
name = "bench"
host = "here"
workdir = {json.dumps(str(work))}
argv = {json.dumps(argv)}
settle_seconds = 1.0
""",
        python=True,
    )


@contextlib.contextmanager
def without_snapshot() -> Iterator[None]:
    """The plan's three snapshot steps as no-ops (the restart as it was before them)."""
    from supervisor import steps

    runner: Any = steps._Runner
    saved = runner.snapshot_possible, runner.take_snapshot, runner.guard_snapshot

    async def nothing(*_args: Any) -> None:
        return None

    runner.snapshot_possible = runner.take_snapshot = runner.guard_snapshot = nothing
    try:
        yield
    finally:
        runner.snapshot_possible, runner.take_snapshot, runner.guard_snapshot = saved


@contextlib.contextmanager
def timing_snapshot(spent: list[float]) -> Iterator[None]:
    """The plan's three snapshot steps as they are, their wall time added to ``spent[-1]``."""
    from supervisor import steps

    runner: Any = steps._Runner
    saved = runner.snapshot_possible, runner.take_snapshot, runner.guard_snapshot

    def timed_step(fn: Any) -> Any:
        async def wrapper(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args)
            finally:
                spent[-1] += time.perf_counter() - t0

        return wrapper

    runner.snapshot_possible, runner.take_snapshot, runner.guard_snapshot = map(timed_step, saved)
    try:
        yield
    finally:
        runner.snapshot_possible, runner.take_snapshot, runner.guard_snapshot = saved


async def restarts(
    config_path: Path, count: int
) -> tuple[list[float], list[float], list[float], str]:
    from supervisor.config import load_config
    from supervisor.engine import Engine

    with_s: list[float] = []
    without: list[float] = []
    spent: list[float] = []
    note = ""
    async with Engine(load_config(config_path)) as engine:
        first = await engine.execute(await engine.plan("bench", action="launch"))
        if not first.ok:
            raise RuntimeError(f"the first launch failed: {[s.to_json() for s in first.steps]}")
        for i in range(2 * count):
            plain = i % 2 == 1
            plan = await engine.plan("bench", action="restart")
            if not plain:
                spent.append(0.0)
            ctx = without_snapshot() if plain else timing_snapshot(spent)
            with ctx:
                t0 = time.perf_counter()
                result = await engine.execute(plan)
                took = time.perf_counter() - t0
            if not result.ok:
                raise RuntimeError(f"a restart failed: {[s.to_json() for s in result.steps]}")
            (without if plain else with_s).append(took)
            if not plain:
                note = next(s.detail for s in result.steps if s.name == "format-check")
        snap = await engine.refresh()
        for h in snap.hosts:
            for r in h.runs:
                if r.process is not None:
                    await engine.kill(h.name, r.process.identity, 5.0, run=r.name)
    return with_s, without, spent, note


def part_two(tmp: Path, restart_mb: int, count: int) -> list[str]:
    from supervisor.demo.server import MockSettings, serve_in_thread

    size = restart_mb * MiB
    with mounted(tmp / "c", max(4 * size, 1 << 30), reflink=True) as mnt:
        cfg = restart_config(mnt, "http://127.0.0.1:1")
        data = mnt / "work" / "out" / "B1" / "raw_responses.jsonl"
        written = write_dataset(data, size)
        with serve_in_thread(MockSettings(decode_tps=40.0, mean_tokens=40)) as srv:
            cfg.write_text(cfg.read_text().replace("http://127.0.0.1:1", srv.url))
            with_s, without, spent, note = asyncio.run(restarts(cfg, count))
    a, b = statistics.median(with_s), statistics.median(without)
    own = statistics.median(spent)
    return [
        f"restart of a run whose dataset holds {written / MiB:,.0f} MiB (reflink image; median "
        f"of {count} each, taking turns; the quiet window, 3x the run's record interval, "
        "dominates both)",
        f"  with the snapshot      {a:8.2f} s   ({', '.join(f'{t:.2f}' for t in with_s)})",
        f"  without the snapshot   {b:8.2f} s   ({', '.join(f'{t:.2f}' for t in without)})",
        f"  whole restarts         ratio {a / b:.3f}x (the difference is the quiet window's noise)",
        f"  the snapshot's steps   {own * 1000:8.1f} ms  (check before the stop, snapshot, check "
        f"after the start: {', '.join(f'{t * 1000:.1f}' for t in spent)} ms)",
        f"  added wait             ratio {(b + own) / b:.4f}x of the restart without the snapshot",
        f"  the format check said: {note}",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=int(os.environ.get("BENCH_SNAPSHOT_MB", 2048)))
    ap.add_argument("--restart-mb", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--restarts", type=int, default=3)
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"bench_snapshot: skipped: {why}")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    state = tmp / "state"
    os.environ["XDG_STATE_HOME"] = str(state / "state")
    os.environ["XDG_CACHE_HOME"] = str(state / "cache")
    os.environ["XDG_CONFIG_HOME"] = str(state / "config")
    try:
        lines, ok = part_one(tmp, args.size_mb, args.repeat)
        print("\n".join(lines), flush=True)
        try:
            print("\n".join(part_two(tmp, args.restart_mb, args.restarts)), flush=True)
        except RuntimeError as e:
            print(f"restart: FAILED: {e}")
            ok = False
        if not ok:
            print("the reflink snapshot was not a reflink, or a restart failed")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
