"""The soak's ``runwatch watch``: one watcher process on the soak's config (started again when the
soak SIGKILLs it), alerting to three receivers (one that works, one that accepts and never answers,
one on a closed port), with the local host's serving endpoint's ``/metrics`` able to drip and its
``nvidia-smi`` (a script on the watcher's PATH: an edge runwatch does not own) able to hang.

Faults (``metrics-drip``, ``smi-hang``) switch the drip or the hang on for some seconds;
:meth:`SoakWatcher.kill` SIGKILLs the watcher and :meth:`SoakWatcher.start` starts the next one
(a generation: its own output file). Invariants, checked at the end from the watchers' JSON output
and what the working receiver got:

- ``watch-silent``: two consecutive lines of one watcher's output (after its first refresh) more
  than 2 x its ``refresh_seconds`` apart (the value the watcher says it refreshes at);
- ``alert-late``: an event a watcher printed that did not reach the working receiver within two
  refreshes (its message is in the body of a single alert or of a digest);
- ``query-orphan``: a child of the fake nvidia-smi still alive once the watcher has stopped (but
  the ones alive when the soak SIGKILLed a watcher: nothing can reap after a SIGKILL);
- ``watcher-died``: a watcher exited before the soak stopped or killed it, or the last one not
  with status 0.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.fixtures_alerts import Receiver
from tests.soak import procs

REFRESH_S = 2.0
"""The soak config's ``refresh_seconds``: the watcher's refresh interval."""
_EVERY = re.compile(r" every ([0-9.]+) s;")
ORPHAN_GRACE_S = 10.0
"""How long a watcher's own processes (not the runs it launched) may outlive it."""
SGLANG = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="soak"} 2.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="soak"} 0.0
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="soak"} %d
"""
SMI = """#!/bin/sh
if [ -e "{hang}" ]; then
  sleep 600 &
  echo $! >> "{pids}"
  wait
fi
case "$1" in
  --query-gpu=*) echo "0, GPU-soak, Soak GPU, 50, 1000, 80000, 300.0, 60" ;;
  *) ;;
esac
"""


class _Hanging:
    """Accepts every connection and never reads or answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


class _Metrics:
    """``/metrics`` in SGLang's names; while ``drip`` is set it sends one byte a second."""

    def __init__(self) -> None:
        self.drip = threading.Event()
        self.closed = threading.Event()
        self.count = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:
                owner.count += 1
                body = (SGLANG % (1000 * owner.count)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not owner.drip.is_set():
                    self.wfile.write(body)
                    return
                for ch in body:
                    if owner.closed.wait(1.0):
                        return
                    with contextlib.suppress(OSError):
                        self.wfile.write(bytes([ch]))
                        self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Generation:
    """One watcher process of the soak and its output."""

    n: int
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    started: float
    killed: float | None = None
    """When the soak SIGKILLed it."""
    stopped: bool = False
    """The soak stopped it with SIGTERM (at the end)."""
    children: list[tuple[int, int, list[str]]] = field(default_factory=list)
    """Its descendants just before the soak killed or stopped it (but runs it launched)."""

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.out.read_text().splitlines() if self.out.exists() else []:
            with contextlib.suppress(ValueError):
                out.append(json.loads(raw))
        return out

    def refresh_s(self) -> float:
        """The interval the watcher says it refreshes at (its first note), else the config's."""
        for e in self.lines()[:5]:
            m = _EVERY.search(str(e.get("note") or ""))
            if m:
                return float(m.group(1))
        return REFRESH_S


class SoakWatcher:
    """The watchers, their receivers and their faults (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root / "watch"
        self.root.mkdir(parents=True, exist_ok=True)
        self.receiver = Receiver()
        self.hanging = _Hanging()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.refused_port = s.getsockname()[1]
        self.metrics = _Metrics()
        self.bin = self.root / "bin"
        self.bin.mkdir(exist_ok=True)
        self.hang_file = self.root / "smi-hang"
        self.pids_file = self.root / "smi-children"
        smi = self.bin / "nvidia-smi"
        smi.write_text(SMI.replace("{hang}", str(self.hang_file)).replace(
            "{pids}", str(self.pids_file)))  # fmt: skip
        smi.chmod(0o755)
        self.gens: list[Generation] = []
        self.excused: set[int] = set()
        """nvidia-smi children alive when the soak SIGKILLed a watcher."""
        self.timers: list[threading.Timer] = []
        self._launch: tuple[Path, dict[str, str], Path] | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.gens[-1].proc if self.gens else None

    def config_toml(self, mock_url: str) -> str:
        """The lines the soak's config gets: the alerts and the local serving endpoint."""
        urls = [
            self.receiver.url("soak"),
            f"json://127.0.0.1:{self.hanging.port}/hang",
            f"json://127.0.0.1:{self.refused_port}/refused",
        ]
        return "\n".join(
            [
                "[[endpoints]]",
                'name = "mock"',
                'kind = "local"',
                f"base_url = {json.dumps(mock_url)}",
                f"metrics_url = {json.dumps(self.metrics.url)}",
                "",
                "[alerts]",
                "urls = [" + ", ".join(json.dumps(u) for u in urls) + "]",
                "max_per_minute = 1000",
                "delivery_timeout_seconds = 5",
                "failing_minutes = 1",
                "",
            ]
        )

    def start(self, config: Path | None = None, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> Generation:  # fmt: skip
        """Start a watcher (the next generation; the same config, state and receivers)."""
        if config is not None and env is not None and cwd is not None:
            self._launch = (config, env, cwd)
        assert self._launch is not None
        config, env, cwd = self._launch
        env = {**env, "PATH": f"{self.bin}{os.pathsep}{env.get('PATH', os.defpath)}"}
        argv = [sys.executable, "-m", "supervisor.cli", "-c", str(config), "watch", "--json"]
        n = len(self.gens)
        out, err = self.root / f"watch-{n}.jsonl", self.root / f"watch-{n}.err"
        with open(out, "wb") as f, open(err, "wb") as e:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=e,
                start_new_session=True,
            )  # fmt: skip
        gen = Generation(n, proc, out, err, time.time())
        self.gens.append(gen)
        return gen

    def kill(self) -> float:
        """SIGKILL the watcher (only its process: what it started is on its own, as after a
        crash); returns when."""
        gen = self.gens[-1]
        gen.children = _children(gen.proc.pid)
        gen.proc.send_signal(signal.SIGKILL)
        gen.killed = time.time()
        gen.proc.wait(30)
        self.excused |= set(self._smi_alive())
        return gen.killed

    def fault(self, kind: str, seconds: float) -> None:
        """``metrics-drip`` or ``smi-hang`` for ``seconds``."""
        if kind == "metrics-drip":
            self.metrics.drip.set()
            timer = threading.Timer(seconds, self.metrics.drip.clear)
        else:
            self.hang_file.touch()
            timer = threading.Timer(seconds, lambda: self.hang_file.unlink(missing_ok=True))
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    def stop(self) -> None:
        for timer in self.timers:
            timer.cancel()
        self.metrics.drip.clear()
        self.hang_file.unlink(missing_ok=True)
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self.gens[-1].stopped = True
            self.gens[-1].children = _children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def lines(self) -> list[dict[str, Any]]:
        """Every generation's output, in order."""
        return [e for gen in self.gens for e in gen.lines()]

    def _smi_alive(self) -> list[int]:
        alive = []
        for raw in self.pids_file.read_text().split() if self.pids_file.exists() else []:
            with contextlib.suppress(FileNotFoundError):
                stat = Path(f"/proc/{raw}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(int(raw))
        return alive

    def check(self, add: Any) -> dict[str, Any]:
        """The invariants (``add(kind, summary, evidence)`` for each violation) and figures."""
        if not self.gens:
            add("watcher-died", "no watcher was started", {})
        for gen in self.gens:
            rc = gen.proc.returncode
            if gen.killed is not None or (gen.stopped and rc == 0):
                continue
            add("watcher-died", f"watcher {gen.n} (pid {gen.proc.pid}) ended with {rc}",
                {"stderr": gen.err.read_text()[-1500:]})  # fmt: skip
        all_gaps: list[float] = []
        ticks = 0
        events = 0
        late = 0
        messages = self.receiver.messages()
        got = list(zip(list(self.receiver.times), messages, strict=False))
        refresh = REFRESH_S
        for gen in self.gens:
            refresh = gen.refresh_s()
            lines = gen.lines()
            ticks += sum(1 for e in lines if "tick" in e)
            first = next((i for i, e in enumerate(lines) if "tick" in e), len(lines))
            stamps = [float(e["time"]) for e in lines[first:] if "tick" in e or "note" in e]
            if gen.killed is not None:
                stamps.append(gen.killed)  # silent until the soak killed it is silent too
            gaps = [(b - a, a) for a, b in itertools.pairwise(stamps)]
            all_gaps += [g for g, _ in gaps]
            for gap, at in gaps:
                if gap > 2 * refresh:
                    add("watch-silent", f"watcher {gen.n}: no output for {gap:.1f} s from "
                        f"{time.ctime(at)} (refresh_seconds {refresh:g})",
                        {"at": at, "gap_s": round(gap, 2), "watcher": gen.n})  # fmt: skip
            for i, e in enumerate(lines):
                if "kind" not in e or "message" not in e:
                    continue
                events += 1
                shown = next((t["time"] for t in lines[i:] if "tick" in t), None)
                if shown is None:
                    continue  # printed at the very end: the watcher stopped before its tick
                bound = float(shown) + 2 * refresh
                if not any(t <= bound and e["message"] in m for t, m in got):
                    late += 1
                    add("alert-late", f"{e['kind']} {e.get('title')} not at the receiver within "
                        "2 refreshes", {"event": e, "bound": bound, "watcher": gen.n})  # fmt: skip
        alive = [pid for pid in self._smi_alive() if pid not in self.excused]
        if alive:
            add("query-orphan", f"nvidia-smi children alive after the watcher: {alive}",
                {"pids": alive})  # fmt: skip
        for gen in self.gens:
            # What a watcher started for itself (its local agent, ssh, queries) ends with it:
            # a SIGKILLed one's agent sees its stdin close. The runs it launched live on.
            deadline = time.monotonic() + ORPHAN_GRACE_S
            left = gen.children
            while True:
                left = [
                    c
                    for c in left
                    if procs.alive(c[0], c[1])
                    and c[0] not in self.excused
                    and procs.launch_token(c[0]) is None  # a run caught in its exec at the time
                ]
                if not left or time.monotonic() > deadline:
                    break
                time.sleep(0.2)  # polling interval of a condition wait
            if left:
                add("query-orphan", f"watcher {gen.n}'s own processes alive "
                    f"{ORPHAN_GRACE_S:g} s after it ended: {[c[0] for c in left]}",
                    {"processes": [{"pid": p, "argv": a} for p, _, a in left],
                     "killed": gen.killed is not None})  # fmt: skip
        for pid in self._smi_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        notes = [e["note"] for e in self.lines() if "note" in e]
        return {
            "watchers (SIGKILLed by the soak)": f"{len(self.gens)} "
            f"({sum(g.killed is not None for g in self.gens)})",
            "refresh_seconds": refresh,
            "refreshes": ticks,
            "longest gap s": round(max(all_gaps, default=0.0), 2),
            "events": events,
            "alerts at the working receiver": len(got),
            "alerts late": late,
            "undelivered notes": sum(n.startswith("alert not delivered") for n in notes),
            "failing-URL notes": sum("failing for" in n for n in notes),
            "took-over notes": sum(n.startswith("took over the pending restart") for n in notes),
            "hung nvidia-smi children": len(self.pids_file.read_text().split())
            if self.pids_file.exists()
            else 0,
            "nvidia-smi children of a SIGKILLed watcher (excused)": len(self.excused),
        }

    def close(self) -> None:
        self.stop()
        self.metrics.close()
        self.hanging.close()
        self.receiver.close()


def _children(pid: int) -> list[tuple[int, int, list[str]]]:
    """The watcher's descendants but the runs it launched: their waiters (``runwatch-waiter``,
    ``supervisor.agent.unit``) and what carries a launch token."""
    return [
        c
        for c in procs.descendants(pid)
        if procs.launch_token(c[0]) is None and "runwatch-waiter" not in c[2]
    ]
