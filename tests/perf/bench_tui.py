"""TUI benchmark: the dashboard in a real terminal (tmux) watching the demo's 8 live datasets.

Measured in the same run and printed:

1. Time to first paint: from starting ``runwatch tui`` to the dashboard showing every dataset with
   a token count (target <= 1 s), next to the same for a bare Textual app showing one line (the
   floor: interpreter and Textual start-up).
2. Steady state while watching at a 1 s refresh for 60 s: the app's CPU (share of one core,
   target <= 5 %) and peak RSS (target <= 150 MB); the host agent it talks to is reported apart
   (on a real fleet it runs on the GPU host). Baseline: the bare Textual app, idle, same terminal.

Run: ``.venv/bin/python tests/perf/bench_tui.py`` (needs tmux).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil

WATCH_S = float(os.environ.get("BENCH_TUI_SECONDS", "60"))
BASELINE_S = 5.0
SOCKET = f"runwatch-bench-{os.getpid()}"
TOKENS = re.compile(r"\b\d[\d,.]*k?/\d[\d,.]*k\b")
DATASETS = [f"B{i}" for i in range(1, 9)]
BARE_APP = """\
from textual.app import App
from textual.widgets import Static
class Bare(App):
    def compose(self):
        yield Static("bare textual app ready")
Bare().run()
"""


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


def steady(proc: psutil.Process, seconds: float) -> tuple[float, float, dict[int, float]]:
    """(CPU % of one core, peak RSS MB) of ``proc`` over ``seconds``; children's CPU % apart."""
    kids = {c.pid: c for c in proc.children(recursive=True)}
    c0 = proc.cpu_times()
    k0 = {pid: sum(c.cpu_times()[:2]) for pid, c in kids.items()}
    t0 = time.perf_counter()
    peak = proc.memory_info().rss
    end = t0 + seconds
    while time.perf_counter() < end:
        time.sleep(min(1.0, max(0.0, end - time.perf_counter())))  # the sampling period
        peak = max(peak, proc.memory_info().rss)
    c1 = proc.cpu_times()
    wall = time.perf_counter() - t0
    cpu = 100 * ((c1.user - c0.user) + (c1.system - c0.system)) / wall
    kid_cpu = {}
    for pid, c in kids.items():
        try:
            kid_cpu[pid] = 100 * (sum(c.cpu_times()[:2]) - k0[pid]) / wall
        except psutil.Error:
            continue
    return cpu, peak / 2**20, kid_cpu


def main() -> int:
    from supervisor.demo.launcher import new_demo, start_demo, stop_demo

    tmp = Path(tempfile.mkdtemp(prefix="runwatch-bench-tui-"))
    os.environ["XDG_STATE_HOME"] = str(tmp / "state")
    demo = new_demo(tmp / "demo")
    (tmp / "demo").mkdir()
    log = io.StringIO()
    env = {**os.environ, "TERM": "xterm-256color"}
    try:
        start_demo(demo, log)
        env.update({k: v for k, v in os.environ.items() if k.startswith("RUNWATCH_DEMO")})

        # Baseline: a bare Textual app in the same terminal.
        bare = tmp / "bare.py"
        bare.write_text(BARE_APP)
        t0, bare_proc = start("bare", [sys.executable, str(bare)], env)
        bare_paint = wait_screen("bare", lambda s: "bare textual app ready" in s) - t0
        bare_cpu, bare_rss, _ = steady(bare_proc, BASELINE_S)
        tmux("kill-session", "-t", "bare")

        # The dashboard on the demo config (refresh_seconds = 1).
        argv = [sys.executable, "-m", "tui.cli", "-c", str(demo.config_path), "tui"]
        t0, app = start("tui", argv, env)

        def painted(text: str) -> bool:
            return all(re.search(rf"\b{d}\b", text) for d in DATASETS) and bool(TOKENS.search(text))

        paint = wait_screen("tui", painted) - t0
        cpu, rss, agents = steady(app, WATCH_S)
        screen = tmux("capture-pane", "-p", "-t", "tui")
        assert painted(screen), screen
        tmux("send-keys", "-t", "tui", "q")
    finally:
        tmux("kill-server")
        stop_demo(demo, log)

    agent_cpu = sum(agents.values())
    print(f"bench_tui: 8 live datasets, 2 runs, 1 s refresh, watched {WATCH_S:.0f} s at 160x48")
    print(
        f"  first paint      {paint:6.2f} s   (bare Textual app: {bare_paint:.2f} s, "
        f"x{paint / bare_paint:.1f})   target <= 1 s: {'ok' if paint <= 1 else 'MISSED'}"
    )
    print(
        f"  CPU, steady      {cpu:6.1f} %   (bare Textual app idle: {bare_cpu:.1f} %, "
        f"x{cpu / max(bare_cpu, 0.1):.1f})   target <= 5 %: {'ok' if cpu <= 5 else 'MISSED'}"
    )
    print(
        f"  RSS, peak        {rss:6.0f} MB  (bare Textual app: {bare_rss:.0f} MB, "
        f"x{rss / bare_rss:.1f})   target <= 150 MB: {'ok' if rss <= 150 else 'MISSED'}"
    )
    print(
        f"  host agent CPU   {agent_cpu:6.1f} %   (local agent subprocess; on a fleet it runs "
        "on the host)"
    )
    return 0 if paint <= 1 and cpu <= 5 and rss <= 150 else 1


if __name__ == "__main__":
    sys.exit(main())
