"""Refresh benchmark against real loopback sshd instances.

Measured in the same run and printed:

1. One full refresh (processes + 8 dataset files of one run) through runwatch's persistent agent
   (``Engine.refresh``) versus the way it is done by hand: a new ``ssh`` process per refresh running
   ``ps aux | grep run_inference`` and a Python one-liner that counts the tokens of the files.
   Between refreshes both see the same new records appended. Target: >= 10x faster.
2. Delay from a kill target's exit to the kill being reported confirmed (median). Target < 0.1 s.
3. A fleet: 32 sshd instances, each with one run, refreshed every 2 s for ~30 s: runwatch's own
   CPU use (the laptop side; the agents run on the "hosts").

Run: ``.venv/bin/python tests/perf/bench_refresh.py`` (needs /usr/sbin/sshd).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from supervisor.config import Config, DatasetConfig, HostConfig, RunConfig
from supervisor.engine import Engine
from tests.fixtures_sshd import SshdPool, SshdServer
from tests.waiting import wait_until

DATASETS = [f"B{i}" for i in range(1, 9)]
RECORDS_PER_FILE = 400
TOKENS_PER_RECORD = 800
REFRESHES = 15
KILLS = 10
FLEET = 32
FLEET_SECONDS = 30.0
FLEET_PERIOD = 2.0

RUN_SCRIPT = """\
import os, signal, sys, time
def on_term(*_):
    # The moment of exit, for the kill-confirmation delay.
    with open(os.environ["EXIT_FILE"], "w") as f:
        f.write(repr(time.time()))
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.environ["READY_FILE"], "w").close()
while True:
    signal.pause()
"""

COUNT_ONE_LINER = (
    "import json,sys; print(sum(json.loads(l)['completion_tokens'] "
    "for f in sys.argv[1:] for l in open(f) if l.strip()))"
)


def record(rng: random.Random, i: int) -> bytes:
    n = max(1, int(rng.gauss(TOKENS_PER_RECORD, TOKENS_PER_RECORD / 4)))
    rec = {
        "sample_id": f"s{i:07d}",
        "output_ids": [rng.randrange(163_840) for _ in range(n)],
        "prompt_tokens": rng.randint(50, 400),
        "completion_tokens": n,
        "finish_reason": "stop",
    }
    return json.dumps(rec).encode() + b"\n"


def make_workdir(base: Path, rng: random.Random) -> Path:
    work = base / "work"
    for ds in DATASETS:
        d = work / "out" / ds
        d.mkdir(parents=True, exist_ok=True)
        with (d / "raw_responses.jsonl").open("wb") as f:
            for i in range(RECORDS_PER_FILE):
                f.write(record(rng, i))
    (work / "run_inference.py").write_text(RUN_SCRIPT)
    return work


def start_run(work: Path, tag: str) -> tuple[subprocess.Popen[bytes], Path]:
    ready = work.parent / f"ready-{tag}"
    exit_file = work.parent / f"exit-{tag}"
    env = {**os.environ, "READY_FILE": str(ready), "EXIT_FILE": str(exit_file)}
    argv = [
        sys.executable,
        "run_inference.py",
        "--datasets",
        ",".join(DATASETS),
        "--max-samples",
        "7000",
        "--output-dir",
        "out",
    ]
    proc = subprocess.Popen(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, start_new_session=True
    )
    wait_until(ready.exists, timeout=20, what="the run to start")
    return proc, exit_file


def host_cfg(server: SshdServer, name: str) -> HostConfig:
    cfg: HostConfig = server.host_config(name, keepalive_interval=5.0, command_timeout=60.0)
    return cfg


def run_cfg(name: str, host: str, work: Path) -> RunConfig:
    return RunConfig(
        name=name,
        host=host,
        workdir=str(work),
        argv=[
            "python3",
            "run_inference.py",
            "--datasets",
            ",".join(DATASETS),
            "--max-samples",
            "7000",
            "--output-dir",
            "out",
        ],
    )


def append_one(work: Path, rng: random.Random, i: int) -> None:
    for ds in DATASETS:
        with (work / "out" / ds / "raw_responses.jsonl").open("ab") as f:
            f.write(record(rng, 1_000_000 + i))


def baseline_refresh(server: SshdServer, work: Path) -> str:
    """The by-hand way: a new ssh per refresh, ps | grep, and a token count over the files."""
    files = [str(work / "out" / ds / "raw_responses.jsonl") for ds in DATASETS]
    remote = "ps aux | grep run_inference; " + shlex.join(
        ["python3", "-c", COUNT_ONE_LINER, *files]
    )
    argv = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(server.client_key),
        "-o",
        f"UserKnownHostsFile={server.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-p",
        str(server.port),
        f"{server.user}@{server.host}",
        remote,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout


async def bench_refresh(pool: SshdPool, base: Path) -> dict[str, float]:
    rng = random.Random(1)
    server = pool.start("bench-one")
    work = make_workdir(base, rng)
    proc, _ = start_run(work, "one")
    hc = host_cfg(server, "gpu")
    config = Config(
        hosts=[hc],
        runs=[run_cfg("eagle3", "gpu", work)],
        datasets={ds: DatasetConfig(token_budget=10_000_000, max_samples=7000) for ds in DATASETS},
    )
    engine = Engine(config)
    try:
        snap = await engine.refresh()  # connect + cold scan (not timed)
        assert snap.hosts[0].connected, snap.hosts[0].error
        assert snap.hosts[0].runs[0].state == "running"
        ours, theirs = [], []
        for i in range(REFRESHES):
            append_one(work, rng, i)
            t = time.perf_counter()
            snap = await engine.refresh()
            ours.append(time.perf_counter() - t)
            assert snap.hosts[0].connected
            t = time.perf_counter()
            text = await asyncio.to_thread(baseline_refresh, server, work)
            theirs.append(time.perf_counter() - t)
            assert "run_inference" in text
        expected = sum(d.completion_tokens for d in snap.hosts[0].runs[0].datasets)
        assert int(text.strip().splitlines()[-1]) == expected, "both ways count the same tokens"
    finally:
        await engine.aclose()
        proc.kill()
        proc.wait()
        server.stop()
    return {"ours": statistics.median(ours), "baseline": statistics.median(theirs)}


async def bench_kill(pool: SshdPool, base: Path) -> list[float]:
    server = pool.start("bench-kill")
    hc = host_cfg(server, "killbox")
    config = Config(hosts=[hc])
    engine = Engine(config)
    delays = []
    kdir = base / "kill"
    kdir.mkdir()
    (kdir / "run_inference.py").write_text(RUN_SCRIPT)
    try:
        for i in range(KILLS):
            proc, exit_file = start_run(kdir, f"k{i}")
            snap = await engine.refresh()
            (p,) = [p for p in snap.hosts[0].processes if p.identity.pid == proc.pid]
            report = await engine.kill("killbox", p.identity, grace=5.0)
            reported = time.time()
            assert report.all_gone, report
            exited = float(exit_file.read_text())
            delays.append(reported - exited)
            proc.wait(timeout=10)
    finally:
        await engine.aclose()
        server.stop()
    return delays


async def bench_fleet(pool: SshdPool, base: Path) -> dict[str, float]:
    rng = random.Random(2)
    servers = [pool.start(f"fleet{i}") for i in range(FLEET)]
    fleet_base = base / "fleet"
    fleet_base.mkdir()
    work = make_workdir(fleet_base, rng)
    proc, _ = start_run(work, "fleet")
    hosts = [host_cfg(s, f"h{i:02d}") for i, s in enumerate(servers)]
    config = Config(
        hosts=hosts,
        runs=[run_cfg(f"run-{h.name}", h.name, work) for h in hosts],
        datasets={ds: DatasetConfig(token_budget=10_000_000) for ds in DATASETS},
    )
    engine = Engine(config)
    refreshes = 0
    try:
        snap = await engine.refresh()  # connect all (not measured)
        assert all(h.connected for h in snap.hosts), [h.error for h in snap.hosts if h.error]
        cpu0, wall0 = time.process_time(), time.monotonic()
        durations = []
        while time.monotonic() - wall0 < FLEET_SECONDS:
            tick = time.monotonic()
            append_one(work, rng, 10_000 + refreshes)
            snap = await engine.refresh()
            durations.append(time.monotonic() - tick)
            refreshes += 1
            assert all(h.connected for h in snap.hosts)
            await asyncio.sleep(max(0.0, FLEET_PERIOD - (time.monotonic() - tick)))
        cpu = time.process_time() - cpu0
        wall = time.monotonic() - wall0
    finally:
        await engine.aclose()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for s in servers:
            s.stop()
    return {
        "cpu_percent": 100.0 * cpu / wall,
        "cpu_s": cpu,
        "wall_s": wall,
        "refreshes": refreshes,
        "median_refresh_s": statistics.median(durations),
        "max_refresh_s": max(durations),
    }


async def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="bench-refresh-"))
    os.environ["XDG_STATE_HOME"] = str(base / "state")
    os.environ["XDG_CACHE_HOME"] = str(base / "cache")
    pool = SshdPool()
    try:
        r = await bench_refresh(pool, base)
        ratio = r["baseline"] / r["ours"]
        print(
            f"refresh, 1 run x {len(DATASETS)} files ({RECORDS_PER_FILE} records of "
            f"~{TOKENS_PER_RECORD} tokens each), median of {REFRESHES}:"
        )
        print(f"  runwatch (persistent agent): {r['ours'] * 1000:8.1f} ms")
        print(f"  by hand (ssh + ps|grep + python count): {r['baseline'] * 1000:8.1f} ms")
        print(f"  ratio: {ratio:.1f}x  (target >= 10x: {'met' if ratio >= 10 else 'NOT met'})")
        delays = await bench_kill(pool, base)
        med = statistics.median(delays)
        print(
            f"kill: exit -> confirmed report, median of {len(delays)}: {med * 1000:.1f} ms "
            f"(max {max(delays) * 1000:.1f} ms; "
            f"target < 100 ms: {'met' if med < 0.1 else 'NOT met'})"
        )
        met = ratio >= 10 and med < 0.1
        f = await bench_fleet(pool, base)
        print(
            f"fleet: {FLEET} sshd hosts x 1 run x {len(DATASETS)} files, every {FLEET_PERIOD:g} s "
            f"for {f['wall_s']:.0f} s ({f['refreshes']:.0f} refreshes):"
        )
        print(f"  runwatch CPU: {f['cpu_percent']:.1f}% of one core ({f['cpu_s']:.2f} s CPU)")
        print(
            f"  refresh of all {FLEET} hosts: median {f['median_refresh_s'] * 1000:.0f} ms, "
            f"max {f['max_refresh_s'] * 1000:.0f} ms"
        )
    finally:
        pool.close()
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
