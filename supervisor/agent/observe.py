"""Writers observed, not inferred: the ``observe_files`` op watches data files over a quiet window.

A writer that does not keep its file open (a shell loop with ``>>``, an appender that opens,
appends and closes per record, another user's process whose descriptors cannot be read, a process
on another node of a shared filesystem) holds no descriptor to find. What it cannot hide is its
effect: the file grows. Before a start, each data file's ``(size, mtime_ns, dev, inode)`` is
sampled every ``interval_s`` for up to ``window_s``; the first change ends the watch early.

Each sample opens the file read-only and reads its attributes from the open descriptor: on NFS
an open revalidates the attributes the client cached (close-to-open consistency), where a bare
``stat`` could answer from a cache up to a minute old. Only regular files are opened (opening a
FIFO or a device can have effects of its own).

Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any

from supervisor.agent import safefs
from supervisor.agent.datafiles import resolve
from supervisor.agent.protocol import (
    AgentOpError,
    FileSample,
    ObservedFile,
    ObserveFilesResult,
    param_number,
)

MAX_WINDOW_S = 120.0
"""Bound on one watch: the op holds a thread of the agent for that long at most."""
MIN_INTERVAL_S = 0.05


def sample(path: str) -> FileSample | None:
    """``path``'s size, mtime, device and inode now; None when it does not exist."""
    try:  # never through another user's link: its target is not the run's file
        st = safefs.stat_file(path)
    except FileNotFoundError:
        return None
    except safefs.UnsafePath as e:
        raise AgentOpError(str(e), "unsafe-path") from None
    except OSError as e:
        raise AgentOpError(f"{path}: cannot stat: {e.strerror}", "unreadable") from None
    if stat.S_ISREG(st.st_mode):
        try:
            fd = safefs.open_file(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except safefs.UnsafePath as e:
            raise AgentOpError(str(e), "unsafe-path") from None
        except OSError:
            pass  # not readable by this user: the stat above is what can be known
        else:
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "ctime_ns": st.st_ctime_ns,
    }


def change(before: FileSample | None, after: FileSample | None) -> str:
    """How ``after`` differs from ``before``: ``grew``, ``shrank``, ``replaced``, ``created``,
    ``removed``, ``modified`` (same size, new mtime), or ``""``."""
    if before is None:
        return "" if after is None else "created"
    if after is None:
        return "removed"
    if (before["dev"], before["ino"]) != (after["dev"], after["ino"]):
        return "replaced"
    if after["size"] > before["size"]:
        return "grew"
    if after["size"] < before["size"]:
        return "shrank"
    if after["mtime_ns"] != before["mtime_ns"] or after["ctime_ns"] != before["ctime_ns"]:
        return "modified"
    return ""


def observe_files(params: dict[str, Any]) -> ObserveFilesResult:
    """The ``observe_files`` op: watch ``paths`` (resolved against ``workdir``) for
    ``window_s`` seconds, sampling every ``interval_s`` (default 0.2), and report each file's
    change, the bytes it gained and the seconds from the first sample to the one that saw it.
    Returns at the first change unless ``full`` is true."""
    raw = params.get("paths")
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p for p in raw):
        raise AgentOpError("parameter 'paths': expected a non-empty list of paths", "bad-params")
    base = params.get("workdir")
    if base is not None and not isinstance(base, str):
        raise AgentOpError("parameter 'workdir': expected a path", "bad-params")
    window = param_number(params, "window_s", 2.0)
    if window > MAX_WINDOW_S:
        raise AgentOpError(f"parameter 'window_s': at most {MAX_WINDOW_S:g} s", "bad-params")
    interval = max(param_number(params, "interval_s", 0.2), MIN_INTERVAL_S)
    full = bool(params.get("full"))
    paths = {p: resolve(p, base) for p in raw}
    first = {p: sample(real) for p, real in paths.items()}
    factor = param_number(params, "recent_factor", 0.0)
    if factor > 0:
        # A file changed moments ago: whoever changed it may write again later than the window.
        now_ns = time.time_ns()
        ages = [(now_ns - s["mtime_ns"]) / 1e9 for s in first.values() if s is not None]
        longest = min(param_number(params, "recent_max_s", window), MAX_WINDOW_S)
        for age in ages:
            if age >= 0:
                window = max(window, min(factor * age, longest))
    began = time.monotonic()
    seen: dict[str, tuple[str, FileSample | None, float]] = {}
    while True:
        now = time.monotonic()
        due = began + window
        if now < due:
            time.sleep(min(interval, due - now))
        elapsed = time.monotonic() - began
        for p, real in paths.items():
            if p in seen:
                continue
            after = sample(real)
            how = change(first[p], after)
            if how:
                seen[p] = (how, after, elapsed)
        if elapsed >= window or (seen and not full):
            break
    files: list[ObservedFile] = []
    for p in raw:
        before = first[p]
        how, after, at = seen.get(p, ("", before, elapsed))
        gained = (after["size"] if after else 0) - (before["size"] if before else 0)
        files.append(
            {
                "path": p,
                "resolved": paths[p],
                "change": how,
                "bytes": gained,
                "seconds": round(at, 3),
                "before": before,
                "after": after,
            }
        )
    return {
        "window_s": window,
        "elapsed_s": round(elapsed, 3),
        "changed": bool(seen),
        "files": files,
    }
