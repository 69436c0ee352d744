"""What grows in a watcher: ``runwatch watch``'s engine driven in this process on the long
benchmarks' machine (``demofleet``: the demo, the 8 live runs, strangers coming and going), with
tracemalloc on.

After ``--warm`` minutes it measures every container (dict, list, set, deque) reachable from the
watcher's and the engine's objects (and with ``--trace`` takes a tracemalloc snapshot); at the end
it prints the containers whose length grew (and the allocation sites that grew most). A diagnosis
tool, not a benchmark (tracemalloc slows the process several times): it judges nothing.

Run: ``.venv/bin/python tests/perf/memwatch.py [--minutes 6] [--warm 2] [--trace]``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
from demofleet import demo_fleet

from supervisor.config import load_config
from supervisor.engine import Engine
from supervisor.watch import Watcher

CONTAINERS = (dict, list, set, collections.deque)


def lengths(root: object, name: str, depth: int = 6) -> dict[str, int]:
    """The length of every container reachable from ``root`` through the attributes of objects of
    runwatch's own classes (and the containers' values), by access path."""
    out: dict[str, int] = {}
    seen: set[int] = set()

    def walk(obj: object, path: str, left: int) -> None:
        if id(obj) in seen or left < 0:
            return
        seen.add(id(obj))
        if isinstance(obj, CONTAINERS):
            out[path] = len(obj)
            values = obj.values() if isinstance(obj, dict) else obj
            for k, v in enumerate(list(values)[:2000]):
                walk(v, f"{path}[*]" if k else f"{path}[0]", left - 1)
            return
        module = type(obj).__module__ or ""
        if not module.startswith(("supervisor", "tui")):
            return
        attrs = getattr(obj, "__dict__", None)
        if attrs is None:
            attrs = {s: getattr(obj, s, None) for s in getattr(type(obj), "__slots__", ())}
        for k, v in attrs.items():
            walk(v, f"{path}.{k}", left - 1)

    walk(root, name, depth)
    return out


async def drive(config: Path, minutes: float, warm: float) -> None:
    cfg = load_config(str(config))
    async with Engine(cfg) as engine:
        watcher = Watcher(engine, emit=lambda line: None, as_json=True)
        start = time.monotonic()
        snap0: tracemalloc.Snapshot | None = None
        warmed = False
        sizes0: dict[str, int] = {}
        me = psutil.Process()
        minute = 0
        while time.monotonic() - start < minutes * 60:
            t = time.monotonic()
            await watcher.tick()
            if t - start >= minute * 60:
                traced = tracemalloc.get_traced_memory()[0] / 2**20
                print(
                    f"{minute:3d} min: {watcher.ticks} refreshes, RSS "
                    f"{me.memory_info().rss / 2**20:.1f} MB, traced {traced:.1f} MB",
                    flush=True,
                )
                minute += 1
            if not warmed and time.monotonic() - start >= warm * 60:
                warmed = True
                snap0 = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
                sizes0 = lengths(watcher, "watcher")
                print(f"warm snapshot after {watcher.ticks} refreshes", flush=True)
            await asyncio.sleep(max(0.0, watcher.interval - (time.monotonic() - t)))
        sizes1 = lengths(watcher, "watcher")
        print(f"end after {watcher.ticks} refreshes")
        if not warmed:
            return
        if snap0 is not None:
            print("allocation sites that grew most (size, count):")
            for stat in tracemalloc.take_snapshot().compare_to(snap0, "traceback")[:15]:
                print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d}")
                for line in stat.traceback.format(limit=6):
                    print(f"      {line}")
        grew = sorted(
            ((sizes1[k] - sizes0.get(k, 0), k) for k in sizes1 if sizes1[k] > sizes0.get(k, 0)),
            reverse=True,
        )
        print("containers that grew (entries):")
        for d, k in grew[:40]:
            print(f"  {d:+7d}  {sizes0.get(k, 0):7d} -> {sizes1[k]:7d}  {k}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--warm", type=float, default=2.0, help="minutes before the first snapshot")
    ap.add_argument("--trace", action="store_true", help="tracemalloc too (slow)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="runwatch-memwatch-"))
    os.environ["XDG_STATE_HOME"] = str(tmp / "state")
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    try:
        with demo_fleet(tmp) as fleet:
            if args.trace:
                tracemalloc.start(12)
            asyncio.run(drive(fleet.config, args.minutes, args.warm))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
