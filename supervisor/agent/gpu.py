"""GPUs: memory per process and a per-GPU summary from ``nvidia-smi``; the ``gpu_holders`` op.

Standard library only, Python >= 3.8 (runs on the host inside the agent). A host without a
working ``nvidia-smi`` has no GPU figures (``None``), never an error.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from supervisor.agent.match import parse_int
from supervisor.agent.protocol import AgentOpError, GpuHoldersResult

GPU_FIELDS = "index,uuid,name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"
"""The ``--query-gpu`` fields asked for, in this order."""
APP_FIELDS = "pid,gpu_uuid,used_memory"
"""The ``--query-compute-apps`` fields asked for, in this order."""


def _num(s: str) -> float | None:
    """A number, or None for ``[N/A]``, ``[Not Supported]`` and the like."""
    try:
        return float(s)
    except ValueError:
        return None


def parse_apps(text: str) -> list[tuple[int, str | None, float]]:
    """``--query-compute-apps=pid,gpu_uuid,used_memory`` lines -> (pid, GPU uuid, MiB).

    Lines of the two-field form ``pid, used_memory`` are read too (uuid None); a memory of
    ``[N/A]`` counts as 0 (the process holds the GPU, its amount is unknown)."""
    out: list[tuple[int, str | None, float]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            pid = int(parts[0])
        except ValueError:
            continue
        uuid = parts[1] if len(parts) >= 3 else None
        mem = _num(parts[-1])
        if mem is None and len(parts) < 3:
            continue
        out.append((pid, uuid, mem or 0.0))
    return out


def parse_gpu_apps(text: str) -> dict[int, float]:
    """Compute-apps lines (see :func:`parse_apps`) -> MiB per pid, summed over its GPUs."""
    out: dict[int, float] = {}
    for pid, _uuid, mem in parse_apps(text):
        out[pid] = out.get(pid, 0.0) + mem
    return out


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """``--query-gpu=`` + :data:`GPU_FIELDS` lines (``csv,noheader,nounits``) -> one dict per GPU;
    ``[N/A]`` fields are None. The older five-field form
    ``index,name,memory.used,memory.total,utilization.gpu`` is read too."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 8:
            gpus.append(
                {
                    "index": parse_int(parts[0]),
                    "uuid": parts[1],
                    "name": parts[2],
                    "utilization_pct": _num(parts[3]),
                    "memory_used_mb": _num(parts[4]),
                    "memory_total_mb": _num(parts[5]),
                    "power_w": _num(parts[6]),
                    "temperature_c": _num(parts[7]),
                    "pids": [],
                }
            )
        elif len(parts) >= 5:
            gpus.append(
                {
                    "index": parse_int(parts[0]),
                    "name": parts[1],
                    "memory_used_mb": _num(parts[2]),
                    "memory_total_mb": _num(parts[3]),
                    "utilization_pct": _num(parts[4]),
                    "pids": [],
                }
            )
    return gpus


def nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def query_gpu(timeout: float = 5.0) -> tuple[dict[int, float] | None, dict[str, Any] | None]:
    """(GPU MiB per pid, GPU summary) from nvidia-smi; (None, None) when the host has none.

    The summary is ``{"gpus": [...]}`` (:func:`parse_gpus`, each GPU with the ``pids`` of the
    compute processes on it), or ``{"error": ...}`` when nvidia-smi fails."""
    exe = nvidia_smi()
    if exe is None:
        return None, None

    def run(*args: str) -> str | None:
        try:
            done = subprocess.run(
                [exe, *args],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        return done.stdout.decode("utf-8", "replace")

    apps = run(f"--query-compute-apps={APP_FIELDS}", "--format=csv,noheader,nounits")
    gpus_text = run(f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits")
    if apps is None and gpus_text is None:
        return None, {"error": "nvidia-smi failed"}
    listed = parse_apps(apps or "")
    gpus = parse_gpus(gpus_text or "")
    by_uuid = {g.get("uuid"): g for g in gpus if g.get("uuid")}
    for pid, uuid, _mem in listed:
        gpu = by_uuid.get(uuid)
        if gpu is not None and pid not in gpu["pids"]:
            gpu["pids"].append(pid)
    return parse_gpu_apps(apps or ""), {"gpus": gpus}


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
