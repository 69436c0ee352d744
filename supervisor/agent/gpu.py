"""GPUs: memory per process and a per-GPU summary from ``nvidia-smi``; the ``gpu_holders`` op.

Standard library only, Python >= 3.8 (runs on the host inside the agent). A host without a
working ``nvidia-smi`` has no GPU figures (``None``), never an error. Both calls share one deadline
(:data:`GPU_DEADLINE_S`) and a byte cap (``agent.bounded``: a hung nvidia-smi is killed with its
process group); output that does not read as nvidia-smi's CSV is reported as unreadable, never
shown as figures.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

from supervisor.agent import bounded
from supervisor.agent.protocol import AgentOpError, GpuHoldersResult

GPU_FIELDS = "index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
"""The ``--query-gpu`` fields asked for, in this order."""
APP_FIELDS = "pid,gpu_uuid,used_memory"
"""The ``--query-compute-apps`` fields asked for, in this order."""
GPU_DEADLINE_S = 5.0
"""Seconds both nvidia-smi calls of one query may take together."""
GPU_MAX_BYTES = 1 << 20
"""Most bytes read from one nvidia-smi call (a host of 8 GPUs prints about 1 KiB)."""
GPU_WAIT_S = 2.0
"""Seconds a refresh waits for nvidia-smi's answer before it takes the last one (stale)."""


def _num(s: str) -> float | None:
    """A number, or None for ``[N/A]``, ``[Not Supported]`` and the like."""
    if s.startswith("["):
        return None
    value = float(s)  # ValueError: not nvidia-smi's output
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"not a figure: {s!r}")
    return value


def _index(s: str) -> int:
    if not s.isdigit():
        raise ValueError(f"not a GPU index: {s!r}")
    return int(s)


def parse_apps(text: str) -> tuple[list[tuple[int, str | None, float]], list[str]]:
    """``--query-compute-apps=pid,gpu_uuid,used_memory`` lines -> ((pid, GPU uuid, MiB), the
    lines that do not read as such).

    Lines of the two-field form ``pid, used_memory`` are read too (uuid None); a memory of
    ``[N/A]`` counts as 0 (the process holds the GPU, its amount is unknown)."""
    out: list[tuple[int, str | None, float]] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) not in (2, 3):
                raise ValueError(line)
            pid = _index(parts[0])
            mem = _num(parts[-1])
        except ValueError:
            bad.append(line)
            continue
        uuid = parts[1] if len(parts) == 3 else None
        if mem is None and uuid is None:
            continue
        out.append((pid, uuid, mem or 0.0))
    return out, bad


def parse_gpu_apps(text: str) -> dict[int, float]:
    """Compute-apps lines (see :func:`parse_apps`) -> MiB per pid, summed over its GPUs."""
    out: dict[int, float] = {}
    for pid, _uuid, mem in parse_apps(text)[0]:
        out[pid] = out.get(pid, 0.0) + mem
    return out


def _percent(s: str) -> float | None:
    value = _num(s)
    if value is not None and value > 100:
        raise ValueError(f"not a percentage: {s!r}")
    return value


def parse_gpus(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """``--query-gpu=`` + :data:`GPU_FIELDS` lines (``csv,noheader,nounits``) -> (one dict per
    GPU, the lines that do not read as such); ``[N/A]`` fields are None. The older five-field
    form ``index,name,memory.used,memory.total,utilization.gpu`` is read too."""
    gpus: list[dict[str, Any]] = []
    bad: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) == 8:
                gpu = {
                    "index": _index(parts[0]),
                    "uuid": parts[1],
                    "name": parts[2],
                    "utilization_pct": _percent(parts[3]),
                    "memory_used_mb": _num(parts[4]),
                    "memory_total_mb": _num(parts[5]),
                    "power_w": _num(parts[6]),
                    "temperature_c": _num(parts[7]),
                    "pids": [],
                }
            elif len(parts) == 5:
                gpu = {
                    "index": _index(parts[0]),
                    "name": parts[1],
                    "memory_used_mb": _num(parts[2]),
                    "memory_total_mb": _num(parts[3]),
                    "utilization_pct": _percent(parts[4]),
                    "pids": [],
                }
            else:
                raise ValueError(line)
        except ValueError:
            bad.append(line)
            continue
        gpus.append(gpu)
    return gpus, bad


def _unreadable(bad: list[str]) -> str:
    first = bad[0][:60] + ("…" if len(bad[0]) > 60 else "")
    return f"nvidia-smi output unreadable ({len(bad)} line(s), first: {first!r})"


def nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def query_gpu(
    timeout: float = GPU_DEADLINE_S,
) -> tuple[dict[int, float] | None, dict[str, Any] | None]:
    """(GPU MiB per pid, GPU summary) from nvidia-smi; (None, None) when the host has none.

    The summary is ``{"gpus": [...]}`` (:func:`parse_gpus`, each GPU with the ``pids`` of the
    compute processes on it), or ``{"error": ...}`` when nvidia-smi fails."""
    exe = nvidia_smi()
    if exe is None:
        return None, None

    deadline = time.monotonic() + timeout
    problems: list[str] = []

    def run(*args: str) -> str | None:
        left = deadline - time.monotonic()
        if left <= 0:
            problems.append(f"no answer within {timeout:g} s")
            return None
        try:
            done = bounded.run([exe, *args], left, GPU_MAX_BYTES)
        except OSError as e:
            problems.append(f"could not start nvidia-smi: {e.strerror or e}")
            return None
        if done.problem is not None:
            # The deadline is the whole query's (both calls), not what was left of it.
            timed_out = done.problem.startswith("no answer within")
            problem = f"no answer within {timeout:g} s" if timed_out else done.problem
            problems.append(f"{problem} (stopped)")
            return None
        if done.returncode != 0:
            return None
        return done.stdout.decode("utf-8", "replace")

    apps = run(f"--query-compute-apps={APP_FIELDS}", "--format=csv,noheader,nounits")
    gpus_text = run(f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits")
    if apps is None and gpus_text is None:
        return None, {"error": f"nvidia-smi failed: {problems[0]}" if problems else
                      "nvidia-smi failed"}  # fmt: skip
    listed, bad_apps = parse_apps(apps or "")
    gpus, bad_gpus = parse_gpus(gpus_text or "")
    if bad_gpus or problems:
        # Half an answer is no answer: figures are shown only from a whole, readable one.
        why = _unreadable(bad_gpus) if bad_gpus else f"nvidia-smi failed: {problems[0]}"
        return None, {"error": why}
    by_uuid = {g.get("uuid"): g for g in gpus if g.get("uuid")}
    for pid, uuid, _mem in listed:
        gpu = by_uuid.get(uuid)
        if gpu is not None and pid not in gpu["pids"]:
            gpu["pids"].append(pid)
    per_pid: dict[int, float] = {}
    for pid, _uuid, mem in listed:
        per_pid[pid] = per_pid.get(pid, 0.0) + mem
    summary: dict[str, Any] = {"gpus": gpus}
    if bad_apps:
        summary["error"] = _unreadable(bad_apps)
    return per_pid, summary


class Poller:
    """nvidia-smi asked for a refresh, one query at a time on a thread of its own: a refresh
    waits for a fresh answer at most ``wait_s``; past it, it gets the last answer marked stale
    (with its age and why), and the query goes on to its own deadline (:func:`query_gpu`). A hung
    nvidia-smi therefore costs a refresh ``wait_s`` at most and never more than one child."""

    def __init__(self, query: Callable[[], Any] | None = None, wait_s: float = GPU_WAIT_S) -> None:
        self._query = query or query_gpu
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._asked = 0.0
        self._last: tuple[float, Any] | None = None

    def _run(self) -> None:
        try:
            result = self._query()
        except Exception as e:  # a broken nvidia-smi never fails the refresh
            result = (None, {"error": f"nvidia-smi failed: {type(e).__name__}: {e}"})
        with self._lock:
            self._last = (time.time(), result)

    def ask(self) -> threading.Thread:
        """Start a query unless one is under way (never waits); the thread answering."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gpu", daemon=True)
                self._asked = time.monotonic()
                self._thread.start()
            return self._thread

    def get(self, asked: threading.Thread | None = None) -> Any:
        """``(GPU MiB per pid, summary)`` as :func:`query_gpu`, fresh or the last one;
        ``asked``: the query started earlier by :meth:`ask` (waited for, not a new one)."""
        thread = asked or self.ask()
        thread.join(self.wait_s)
        with self._lock:
            since, last = self._asked, self._last
        if not thread.is_alive() and last is not None:
            return last[1]
        waited = time.monotonic() - since
        if last is None:
            return None, {"error": f"nvidia-smi: no answer yet after {waited:.0f} s (still asked)"}
        at, (per_pid, summary) = last
        stale = dict(summary or {})
        age = time.time() - at
        why = f"nvidia-smi slow: no answer for {waited:.0f} s; figures from {age:.0f} s ago"
        if stale.get("error"):
            why = f"{why} ({stale['error']})"
        stale["error"] = why
        return per_pid, stale


def gpu_holders(params: dict[str, Any]) -> GpuHoldersResult:
    """``{pids?: [int]}`` -> ``{"available": bool, "holders": {pid: MiB}}``.

    ``available`` is false where the host has no working nvidia-smi. With ``pids``, only those
    processes are reported (the laptop passes the stopped run's process tree).
    """
    wanted = params.get("pids")
    if wanted is not None and (
        not isinstance(wanted, list) or not all(isinstance(p, int) for p in wanted)
    ):
        raise AgentOpError("parameter 'pids': expected a list of integers", "bad-params")
    apps, summary = query_gpu()
    if apps is None:
        return {"available": False, "holders": {}, "detail": (summary or {}).get("error")}
    holders = {str(pid): mb for pid, mb in apps.items() if wanted is None or pid in wanted}
    return {"available": True, "holders": holders}
