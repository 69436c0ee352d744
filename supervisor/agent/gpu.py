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


def parse_gpu_apps(text: str) -> dict[int, float]:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` -> MiB."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            pid = int(parts[0])
            mem = float(parts[1])
        except ValueError:
            continue  # "[N/A]" or "[Not Supported]"
        out[pid] = out.get(pid, 0.0) + mem
    return out


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu ...``."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue

        def num(s: str) -> float | None:
            try:
                return float(s)
            except ValueError:
                return None

        gpus.append(
            {
                "index": parse_int(parts[0]),
                "name": parts[1],
                "memory_used_mb": num(parts[2]),
                "memory_total_mb": num(parts[3]),
                "utilization_pct": num(parts[4]),
            }
        )
    return gpus


def nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def query_gpu(timeout: float = 5.0) -> tuple[dict[int, float] | None, dict[str, Any] | None]:
    """(GPU MiB per pid, GPU summary) from nvidia-smi; (None, None) when the host has none."""
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

    apps = run("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    gpus = run(
        "--query-gpu=index,name,memory.used,memory.total,utilization.gpu",
        "--format=csv,noheader,nounits",
    )
    if apps is None and gpus is None:
        return None, {"error": "nvidia-smi failed"}
    return parse_gpu_apps(apps or ""), {"gpus": parse_gpus(gpus or "")}


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
