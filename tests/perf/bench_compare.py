"""``runwatch compare`` on the demo: wall time, and whether its rates tell the truth.

Starts the demo (two mock servers, two runs of the reference client), refreshes it as the
dashboard does (every ``refresh_seconds``) for ``WATCH_S`` seconds, which leaves the rate history
in the state dir, then measures and prints:

1. ``runwatch compare --json`` as a new process (Python start-up, config, one refresh through the
   agent, the answer): wall time of each of ``RUNS`` runs, median and max, against the baseline
   measured in the same run, taking turns: ``runwatch status --json`` on the same config (the
   same start-up, config and refresh, without compare's tokenizer and answer). Target: median
   compare at most 1.5x the median status (the 2 s the demo is meant for printed beside it).
2. The local endpoint's rate from the data files, with its uncertainty, against the local mock's
   configured capacity (``LOCAL_MOCK["capacity_tps"]``): it must not exceed it by more than its
   stated uncertainty. The serving engine's counter rate (from /metrics) beside it, and the gap.
3. What the dashboard's engine read from the local mock's ``/metrics`` (running, queued, KV,
   server tok/s, TTFT) and how many points each sparkline has, and whether they moved.

Run: ``.venv/bin/python tests/perf/bench_compare.py`` (a private state dir is used). Exit status 1
when a target is missed (the time ratio, or the rate above capacity + its uncertainty).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WATCH_S = float(os.environ.get("BENCH_WATCH_S", "60"))
RUNS = 5


async def watch(config: object, seconds: float) -> dict[str, object]:
    from supervisor.engine import Engine

    seen: dict[str, object] = {}
    async with Engine(config) as engine:  # type: ignore[arg-type]
        end = time.monotonic() + seconds
        firsts = None
        while time.monotonic() < end:
            started = time.monotonic()
            snap = await engine.refresh()
            host = snap.hosts[0]
            ems = [e for e in host.endpoints if e.name == "local-gpu"]
            run = next(r for r in host.runs if r.name == "local-gpu")
            if ems and firsts is None and ems[0].available:
                firsts = (list(ems[0].gen_tok_per_s.history), list(run.history))
            if ems:
                seen["endpoint"] = ems[0]
            seen["run"] = run
            await asyncio.sleep(max(0.0, config.refresh_seconds - (time.monotonic() - started)))  # type: ignore[attr-defined]
        seen["firsts"] = firsts
    return seen


async def reopen(config: object) -> tuple[int, int, float | None]:
    """A new engine's first refresh (the dashboard opening): sparkline points of the local run
    and of the local server's tok/s, and the server's rate, straight from the history."""
    from supervisor.engine import Engine

    async with Engine(config) as engine:  # type: ignore[arg-type]
        host = (await engine.refresh()).hosts[0]
    run = next(r for r in host.runs if r.name == "local-gpu")
    em = next(e for e in host.endpoints if e.name == "local-gpu")
    return len(run.history), len(em.gen_tok_per_s.history), em.gen_tok_per_s.value


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="runwatch-bench-compare-"))
    os.environ["XDG_STATE_HOME"] = str(tmp / "state")
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")
    from supervisor.demo.launcher import LOCAL_MOCK, new_demo, start_demo, stop_demo

    demo = new_demo(tmp / "demo")
    (tmp / "demo").mkdir()
    log = io.StringIO()
    try:
        start_demo(demo, log)
        print(f"demo started in {demo.demo_dir}; watching for {WATCH_S:.0f} s")
        seen = asyncio.run(watch(demo.config, WATCH_S))
        compare_argv = [
            sys.executable,
            "-m",
            "supervisor.cli",
            "compare",
            "-c",
            str(demo.config_path),
        ]
        status_argv = [
            sys.executable,
            "-m",
            "supervisor.cli",
            "status",
            "-c",
            str(demo.config_path),
        ]
        reopened = asyncio.run(reopen(demo.config))
        times: list[float] = []
        base: list[float] = []
        out = {}
        for _ in range(RUNS):
            for argv, into in ((status_argv, base), (compare_argv, times)):
                t0 = time.monotonic()
                p = subprocess.run(
                    [*argv, "--json"],
                    capture_output=True,
                    text=True,
                    env=os.environ.copy(),
                    timeout=120,
                )
                into.append(time.monotonic() - t0)
                if p.returncode != 0:
                    print(p.stderr)
                    raise SystemExit(1)
            out = json.loads(p.stdout)
        text = subprocess.run(
            compare_argv,
            capture_output=True,
            text=True,
            env=os.environ.copy(),
            timeout=120,
        ).stdout
    finally:
        stop_demo(demo, io.StringIO())
    print(f"\n1. runwatch compare wall time over {RUNS} runs (new process each):")
    ratio = statistics.median(times) / statistics.median(base)
    fast = ratio <= 1.5
    print(
        f"   median {statistics.median(times):.2f} s, max {max(times):.2f} s (the demo's aim:"
        f" < 2 s); status --json: median {statistics.median(base):.2f} s; compare / status ="
        f" {ratio:.2f}x, target <= 1.5x: {'ok' if fast else 'MISSED'}"
    )
    cap = float(LOCAL_MOCK["capacity_tps"])
    local = next(r for r in out["rates"] if r["endpoint"] == "local-gpu")
    rate, err = local["out_tok_per_s"], local["out_tok_per_s_err"]
    print("\n2. local endpoint, capacity of the mock:", f"{cap:g} tok/s")
    print(f"   files: {rate:.0f} ± {err or 0:.0f} tok/s ({local['source']})")
    ok = rate is not None and rate <= cap + (err or 0)
    print(f"   within capacity + uncertainty: {'yes' if ok else 'NO'}")
    if local.get("server_tok_per_s") is not None:
        print(
            f"   server counters: {local['server_tok_per_s']:.0f} tok/s, "
            f"gap {local.get('gap_tok_per_s') or 0:.0f} tok/s"
        )
    em = seen.get("endpoint")
    run = seen.get("run")
    print("\n3. the dashboard's engine, from the local mock's /metrics:")
    if em is not None:
        print(
            f"   running {em.running.value}, queued {em.queued.value}, "  # type: ignore[attr-defined]
            f"KV {em.kv_usage.value}, server {em.gen_tok_per_s.value} tok/s, "  # type: ignore[attr-defined]
            f"TTFT p50 {em.ttft_p50_s} s p90 {em.ttft_p90_s} s"  # type: ignore[attr-defined]
        )
        firsts = seen.get("firsts") or ([], [])
        print(
            f"   sparkline points: server tok/s {len(em.gen_tok_per_s.history)} "  # type: ignore[attr-defined]
            f"(first look {len(firsts[0])}), run tok/s {len(run.history)} "  # type: ignore[attr-defined,index]
            f"(first look {len(firsts[1])})"  # type: ignore[index]
        )
    print(
        f"   a new engine's first refresh (the dashboard opening): run tok/s {reopened[0]} "
        f"points, server tok/s {reopened[1]} points, server rate {reopened[2]} tok/s"
    )
    print("\n" + text)
    return 0 if ok and fast else 1


if __name__ == "__main__":
    sys.exit(main())
