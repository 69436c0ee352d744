"""Request rate of ``runwatch bench``'s engine versus a minimal raw httpx loop, same run.

The mock server answers at once (no pacing, 16-token answers) and runs in its own process, so it
does not share the GIL with the client. At each concurrency, taking turns over several rounds:

1. ``engine``: ``supervisor.bench.runner.Bench`` (what ``runwatch bench`` runs), warm-up included
   but not timed, every response decoded and its usage kept;
2. ``raw``: the minimal loop: one ``httpx.AsyncClient`` with a pool of C connections, C tasks doing
   ``await client.post(url, json=payload)`` (the response body read, nothing parsed);
3. ``raw-1conn``: the same loop with one client (one connection) per task, the layout the engine
   uses: the best a raw httpx loop does here, to show what bounds both.

Target: engine >= 0.8 x raw, each measured in the same rounds (the absolute rate is printed, not
judged: it is the machine's). The server's CPU use during the runs is printed: near 100 % of one
core means the mock, not the client, is the ceiling.

Run: ``.venv/bin/python tests/perf/bench_client.py [--requests N] [--concurrency 32,8]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx
import psutil

from supervisor.bench.prompts import load_prompts
from supervisor.bench.runner import Bench, Options
from supervisor.bench.target import Target
from supervisor.demo.prompts import write_prompts


def start_mock() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.demo.server",
            "--port",
            "0",
            "--mean-tokens",
            "16",
            "--length-sigma",
            "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()  # printed once the server listens
    if not url.startswith("http"):
        proc.kill()
        raise SystemExit(f"mock server did not start: {url!r}")
    return proc, url


async def engine_rate(url: str, prompts_file: Path, c: int, n: int) -> float:
    prompts = load_prompts(prompts_file)
    bench = Bench(
        Target(name="mock", base_url=url, model="demo-model", max_tokens=16),
        prompts,
        Options(requests=n, concurrency=[c]),
    )
    result = await bench.run()
    (level,) = result.levels
    assert level.completed == n, level
    return level.req_per_s


async def raw_rate(url: str, c: int, n: int, per_task_client: bool) -> float:
    endpoint = f"{url}/chat/completions"
    payload = {
        "model": "demo-model",
        "messages": [{"role": "user", "content": "Explain the budget."}],
        "max_tokens": 16,
    }
    if per_task_client:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        clients = [httpx.AsyncClient(limits=limits) for _ in range(c)]
    else:
        limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
        clients = [httpx.AsyncClient(limits=limits)]
    left = [0]

    async def worker(i: int) -> None:
        client = clients[i % len(clients)]
        while left[0] > 0:
            left[0] -= 1
            r = await client.post(endpoint, json=payload)
            assert r.status_code == 200

    try:
        left[0] = c  # warm-up: open every connection
        await asyncio.gather(*(worker(i) for i in range(c)))
        left[0] = n
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(c)))
        return n / (time.perf_counter() - t0)
    finally:
        for cl in clients:
            await cl.aclose()


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    ap.add_argument("--concurrency", default="32,8")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    n = args.requests
    started = time.monotonic()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        # The bench history (``supervisor.bench.history``) is the user's: never written here.
        os.environ["XDG_STATE_HOME"] = os.path.join(tmp, "state")
        os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
        prompts_file = write_prompts(tmp, ["B7"], count=50)["B7"]
        proc, url = start_mock()
        server = psutil.Process(proc.pid)
        me = psutil.Process()
        try:
            print(f"mock server (own process, pid {proc.pid}) at {url}; {os.cpu_count()} cores")
            print(f"{n} requests per measurement, {args.rounds} rounds taking turns\n")
            for c in levels:
                names = ("engine", "raw", "raw-1conn")
                rates: dict[str, list[float]] = {k: [] for k in names}
                cpu_us: dict[str, list[float]] = {k: [] for k in names}
                server_busy: list[float] = []
                for _ in range(args.rounds):
                    for name in names:
                        srv0, own0, t0 = cpu_s(server), cpu_s(me), time.monotonic()
                        if name == "engine":
                            rate = asyncio.run(engine_rate(url, prompts_file, c, n))
                        else:
                            rate = asyncio.run(raw_rate(url, c, n, per_task_client=name != "raw"))
                        srv1, own1, t1 = cpu_s(server), cpu_s(me), time.monotonic()
                        rates[name].append(rate)
                        # Client CPU per request (warm-up included, c of n requests): unlike the
                        # wall rate, it hardly moves when other processes load the machine.
                        cpu_us[name].append((own1 - own0) / (n + c) * 1e6)
                        server_busy.append((srv1 - srv0) / (t1 - t0))
                best = {k: max(v) for k, v in rates.items()}
                lean = {k: min(v) for k, v in cpu_us.items()}
                ratio = best["engine"] / best["raw"]
                print(f"concurrency {c}:")
                for k in names:
                    spread = ", ".join(f"{x:,.0f}" for x in rates[k])
                    print(
                        f"  {k:<10} best {best[k]:>6,.0f} req/s  (rounds {spread});"
                        f"  client CPU {lean[k]:.0f} us/request"
                    )
                print(f"  engine / raw, req/s          = {ratio:.2f}  (target >= 0.8)")
                print(f"  engine / raw-1conn, req/s    = {best['engine'] / best['raw-1conn']:.2f}")
                print(f"  raw / engine, CPU per request = {lean['raw'] / lean['engine']:.2f}")
                print(
                    f"  raw-1conn / engine, CPU per request = "
                    f"{lean['raw-1conn'] / lean['engine']:.2f}"
                )
                print(
                    f"  mock server CPU while measuring: median "
                    f"{100 * statistics.median(server_busy):.0f} % of one core; "
                    f"load average {os.getloadavg()[0]:.1f}\n"
                )
                ok = ok and ratio >= 0.8
        finally:
            proc.terminate()
            proc.wait(10)
    print(f"targets {'met' if ok else 'MISSED'}; took {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
